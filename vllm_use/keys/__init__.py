"""API keys: `material` (secrets, scrypt, row validation), `store` (every `api_keys` query) and
`authenticator` (Bearer parsing, the admin token, verification with its cache; docs/auth.md)."""
