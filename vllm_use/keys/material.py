"""API key material and records (docs/auth.md, "API keys"): generation, scrypt hashing, row validation.

Secrets are `vu_` + 48 alphanumerics, ids 24 alphanumerics, both sampled
without bias (`secrets.choice`). Only a salt and an scrypt hash are stored;
the secret is shown once. Every row read back is validated in full — before
any scrypt — and a bad row is a `CorruptRecord`, never a usable key.
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

from vllm_use.clock import iso
from vllm_use.errors import CorruptRecord, InvalidArguments
from vllm_use.fields import KEY_ID_RE, has_control
from vllm_use.scopes import ALL_SCOPES, Scope

ALPHANUM = string.ascii_letters + string.digits
SECRET_RE = re.compile(r"vu_[A-Za-z0-9]{48}")
PREFIX_LEN = 11  # "vu_" + 8 characters: enough to find the row, too little to matter
NAME_MAX_BYTES = 128
# scrypt cost: ~40 ms and 16 MiB per derivation on this class of CPU; runs in an executor.
SCRYPT_N, SCRYPT_R, SCRYPT_P, HASH_LEN, SALT_LEN = 2**14, 8, 1, 32, 16


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


def cache_digest(secret: str) -> bytes:
    """Key of the verified-key cache: a fast hash, so the secret itself is never held."""
    return hashlib.sha256(secret.encode("ascii")).digest()


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
    return KeyRecord(label, name, prefix, salt, digest, bool(enabled), scopes, created, used)


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
