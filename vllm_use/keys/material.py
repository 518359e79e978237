"""API key material and records (docs/auth.md, "API keys"): generation, scrypt hashing, row validation.

Secrets are `vu_` + 48 alphanumerics, ids 24 alphanumerics, both sampled
without bias (`secrets.choice`). Only a salt and an scrypt hash are stored;
the secret is shown once. Every row read back is validated in full — before
any scrypt — and a bad row is a `CorruptRecord`, never a usable key. The key
policy's bounds (expiry, models, limits: docs/observability.md, "Key limits")
are written here once, for the input models and for the rows read back.
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
import string
from dataclasses import dataclass
from typing import Any

from cryptography.hazmat.primitives import constant_time
from cryptography.hazmat.primitives.kdf.scrypt import Scrypt

from vllm_use.clock import iso, now_ms
from vllm_use.errors import CorruptRecord, InvalidArguments
from vllm_use.fields import KEY_ID_RE, has_control
from vllm_use.runtime.options import NAME_PATTERN
from vllm_use.scopes import ALL_SCOPES, KeyPolicy, Scope

ALPHANUM = string.ascii_letters + string.digits
SECRET_RE = re.compile(r"vu_[A-Za-z0-9]{48}")
PREFIX_LEN = 11  # "vu_" + 8 characters: enough to find the row, too little to matter
NAME_MAX_BYTES = 128
# scrypt cost: ~40 ms and 16 MiB per derivation on this class of CPU; runs in an executor.
SCRYPT_N, SCRYPT_R, SCRYPT_P, HASH_LEN, SALT_LEN = 2**14, 8, 1, 32, 16
# The policy's bounds (inclusive). A model is named as a deployment is: NAME_PATTERN, ≤ 256 bytes.
RPM_MAX, CONCURRENT_MAX, TOKENS_PER_DAY_MAX, MODELS_MAX = 100_000, 10_000, 10**12, 64
EXPIRES_MAX_MS = 253_402_300_799_000  # 9999-12-31T23:59:59Z: the last time an ISO answer can show
LIMIT_BOUNDS = {"rpm": RPM_MAX, "max_concurrent": CONCURRENT_MAX, "tokens_per_day": TOKENS_PER_DAY_MAX}
_MODEL_NAME_RE = re.compile(NAME_PATTERN)


def new_secret() -> str:
    return "vu_" + "".join(secrets.choice(ALPHANUM) for _ in range(48))


def new_key_id() -> str:
    return "".join(secrets.choice(ALPHANUM) for _ in range(24))


def derive(secret: str, salt: bytes) -> bytes:
    """scrypt(secret, salt). Slow on purpose: runs in an executor, never on the IOLoop."""
    kdf = Scrypt(salt=salt, length=HASH_LEN, n=SCRYPT_N, r=SCRYPT_R, p=SCRYPT_P)
    return kdf.derive(secret.encode("ascii"))


def matches(secret: str, salt: bytes, expected: bytes) -> bool:
    """Runs in an executor. Constant-time comparison of the derived hash."""
    return constant_time.bytes_eq(derive(secret, salt), expected)


def token_digest(token: str) -> bytes:
    """A fast hash of a presented token: compared with the admin token's, and the key of the
    verified-key cache, so the secret itself is never held."""
    return hashlib.sha256(token.encode()).digest()


def validate_name(value: str) -> str:
    if len(value.encode("utf-8")) > NAME_MAX_BYTES or not value.strip():
        raise InvalidArguments(
            f"name must be 1 to {NAME_MAX_BYTES} bytes and not blank",
            errors=[{"loc": ["name"], "msg": f"1 to {NAME_MAX_BYTES} UTF-8 bytes"}],
        )
    if has_control(value):
        raise InvalidArguments(
            "name must not contain control characters",
            errors=[{"loc": ["name"], "msg": "control characters are not allowed"}],
        )
    return value


@dataclass(frozen=True)
class KeyRecord:
    """A validated api_keys row."""

    id: str
    name: str
    prefix: str
    salt: bytes
    hash: bytes
    enabled: bool
    scopes: tuple[Scope, ...]
    created_at: int
    last_used_at: int | None
    expires_at: int | None = None  # unix ms
    models: tuple[str, ...] | None = None
    rpm: int | None = None
    max_concurrent: int | None = None
    tokens_per_day: int | None = None

    def policy(self) -> KeyPolicy | None:
        """The model list and limits the gateway enforces; None when the key has neither."""
        if (self.models, self.rpm, self.max_concurrent, self.tokens_per_day) == (None, None, None, None):
            return None
        models = None if self.models is None else frozenset(self.models)
        return KeyPolicy(models, self.rpm, self.max_concurrent, self.tokens_per_day)

    def expired(self, at_ms: int | None = None) -> bool:
        return self.expires_at is not None and self.expires_at <= (now_ms() if at_ms is None else at_ms)

    def public(self, last_used_at: int | None = None) -> dict[str, Any]:
        used = max(filter(None, (self.last_used_at, last_used_at)), default=None)
        return {
            "id": self.id,
            "name": self.name,
            "prefix": self.prefix,
            "scopes": [s.value for s in self.scopes],
            "enabled": self.enabled,
            "created_at": iso(self.created_at),
            "last_used_at": iso(used),
            "expires_at": iso(self.expires_at),
            "expired": self.expired(),
            "models": None if self.models is None else list(self.models),
            "rpm": self.rpm,
            "max_concurrent": self.max_concurrent,
            "tokens_per_day": self.tokens_per_day,
        }


def parse_row(row: dict[str, Any]) -> KeyRecord:
    """Validate every field of an api_keys row read from SQLite; raise CorruptRecord naming it."""
    raw_id = row.get("id")
    label = raw_id if isinstance(raw_id, str) and KEY_ID_RE.fullmatch(raw_id) else "<malformed id>"

    def bad(why: str) -> CorruptRecord:
        return CorruptRecord(f"api key record {label} is corrupt: {why}", record=label)

    if label == "<malformed id>":
        raise bad("id is not 24 letters or digits")
    name = row.get("name")
    if not isinstance(name, str):
        raise bad("name is not text")
    try:
        validate_name(name)
    except InvalidArguments as exc:
        raise bad(exc.message) from None
    prefix = row.get("prefix")
    if not isinstance(prefix, str) or not re.fullmatch(r"vu_[A-Za-z0-9]{8}", prefix):
        raise bad("prefix is malformed")
    try:
        salt = bytes.fromhex(row.get("salt"))
        digest = bytes.fromhex(row.get("hash"))
    except (TypeError, ValueError):
        raise bad("salt or hash is not hex") from None
    if len(salt) != SALT_LEN or len(digest) != HASH_LEN:
        raise bad("salt or hash has the wrong length")
    enabled = row.get("enabled")
    if enabled not in (0, 1) or isinstance(enabled, float):
        raise bad("enabled is not 0 or 1")
    scopes = parse_scopes(row.get("scopes"), bad)
    created, used = row.get("created_at"), row.get("last_used_at")
    if type(created) is not int or created <= 0:
        raise bad("created_at is not a timestamp")
    if used is not None and (type(used) is not int or used < created):
        raise bad("last_used_at is not a timestamp after created_at")
    expires = row.get("expires_at")
    if expires is not None and (type(expires) is not int or not created < expires <= EXPIRES_MAX_MS):
        raise bad("expires_at is not a timestamp after created_at, before year 10000")
    limits = {}
    for column, most in LIMIT_BOUNDS.items():
        value = row.get(column)
        if value is not None and (type(value) is not int or not 1 <= value <= most):
            raise bad(f"{column} is not a whole number from 1 to {most}")
        limits[column] = value
    models = parse_models(row.get("models"), bad)
    return KeyRecord(
        label, name, prefix, salt, digest, bool(enabled), scopes, created, used, expires, models, **limits
    )


def parse_models(raw: Any, bad: Any) -> tuple[str, ...] | None:
    if raw is None:
        return None
    try:
        values = json.loads(raw) if isinstance(raw, str) else None
    except ValueError:
        values = None
    if not isinstance(values, list) or not 1 <= len(values) <= MODELS_MAX:
        raise bad(f"models is not a JSON list of 1 to {MODELS_MAX} names")
    if not all(isinstance(v, str) and _MODEL_NAME_RE.fullmatch(v) for v in values):
        raise bad("models holds a name that is not a deployment name")
    if len(set(values)) != len(values):
        raise bad("duplicate models")
    return tuple(values)


def parse_scopes(raw: Any, bad: Any) -> tuple[Scope, ...]:
    try:
        values = json.loads(raw) if isinstance(raw, str) else None
    except ValueError:
        values = None
    if not isinstance(values, list) or not values or not all(isinstance(v, str) for v in values):
        raise bad("scopes is not a non-empty JSON list of strings")
    unknown = [v for v in values if v not in ALL_SCOPES]
    if unknown:
        raise bad(f"unknown scope {unknown[0][:64]!r}")
    if len(set(values)) != len(values):
        raise bad("duplicate scopes")
    return tuple(Scope(v) for v in values)
