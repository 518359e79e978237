"""Which settings keys count as credentials (docs/security.md, "Secrets")."""

from __future__ import annotations

import pytest

from vllm_use.sensitive import is_sensitive_key


@pytest.mark.parametrize(
    "key",
    [
        "token",
        "Password",
        "passwd",
        "secret",
        "hf_credentials",
        "api_key",
        "API-Key",
        "apiKey",
        "api key",
        "a\u200bpi_key",  # zero-width space inside the word
        "\uff21\uff30\uff29\uff3f\uff2b\uff25\uff39",  # full-width "API_KEY"
        "client.secret",
        "upstream\u00a0api\u2013key",  # no-break space and en dash
        "TOKEN\u0000",  # control character
    ],
)
def test_credential_like_keys_are_sensitive(key: str) -> None:
    assert is_sensitive_key(key)


@pytest.mark.parametrize("key", ["theme", "default_model", "api.base_url", "ui.language", "max_parallel"])
def test_ordinary_keys_are_not_sensitive(key: str) -> None:
    assert not is_sensitive_key(key)


def test_sensitive_word_inside_a_longer_key_is_still_sensitive() -> None:
    # Deliberately broad: a false positive costs a rename, a false negative stores a secret.
    assert is_sensitive_key("max_tokens_default")
