"""Which setting keys look like credentials (docs/security.md, "Secrets").

Credentials come only from flags and the environment; the settings table must never hold
one. `settings.update` refuses sensitive keys and every database open purges rows that slipped
in (older versions, hand edits), both with this one rule so they cannot disagree.

The rule is deliberately broad, because a false positive costs a rename while a false negative
stores a secret: NFKC-normalise (full-width letters become ASCII), case-fold, drop punctuation,
symbols, separators and format/control characters (so "api_key", "API-Key", "api key" and
"a<zero-width space>pi_key" all become "apikey"), then look for a sensitive word anywhere.
"""

from __future__ import annotations

import logging
import unicodedata

log = logging.getLogger(__name__)

SENSITIVE_WORDS: tuple[str, ...] = ("token", "password", "passwd", "secret", "credential", "apikey")

# Unicode general categories removed before matching: P* punctuation, S* symbols,
# Z* separators, M* combining marks (after NFD, so "tok\u0301en" reads as "token"), and Cf/Cc
# (zero-width and other invisible format characters, controls).
_DROPPED_MAJOR = frozenset("PSZM")
_DROPPED_EXACT = frozenset({"Cf", "Cc"})


def _canonical(key: str) -> str:
    # Case folding can produce characters NFKC would rewrite again (e.g. some ligatures), so
    # normalise on both sides of it.
    folded = unicodedata.normalize("NFKD", unicodedata.normalize("NFKC", key).casefold())
    return "".join(
        ch
        for ch in folded
        if (category := unicodedata.category(ch))[0] not in _DROPPED_MAJOR and category not in _DROPPED_EXACT
    )


def is_sensitive_key(key: str) -> bool:
    """True when a settings key looks like it names a credential and must not be stored."""
    canonical = _canonical(key)
    return any(word in canonical for word in SENSITIVE_WORDS)
