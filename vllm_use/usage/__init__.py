"""Token accounting: what each key used, per day and deployment (docs/observability.md)."""
