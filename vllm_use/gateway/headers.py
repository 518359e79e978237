"""The gateway's header rules (docs/gateway.md, "Per request"): what goes upstream, what comes back to
the client.

The client that talks to the upstream is `vllm_use.gateway.upstream.UpstreamPool`.
"""

from __future__ import annotations

# Hop-by-hop headers (RFC 9110 §7.6.1) and the ones the gateway owns.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)
REQUEST_DROP = HOP_BY_HOP | {
    "host",
    "content-length",
    "authorization",
    "x-api-key",
    "cookie",
    "accept-encoding",
    "x-conversation-id",
    "origin",
    # What a proxy says about the client: the upstream must not trust a client's claim to be
    # someone else (nor learn its address); the X-Forwarded-* family is dropped below too.
    "forwarded",
    "x-real-ip",
    "x-request-id",  # ours: the client's when it is valid, else a new one (set below)
}
RESPONSE_DROP = HOP_BY_HOP | {
    "content-length",
    "cache-control",
    "pragma",
    "expires",
    "set-cookie",
    "server",
    "date",
    "content-encoding",
}


def forward_headers(
    items: list[tuple[str, str]], upstream_key: str | None, request_id: str
) -> dict[str, str]:
    """Client headers → upstream headers: hop-by-hop, credentials and client-address claims
    (Forwarded, X-Real-IP, X-Forwarded-*) dropped, our key injected."""
    # RFC 9110 §7.6.1: the fields a client names in Connection are hop-by-hop too.
    listed = {
        token.strip().lower()
        for name, value in items
        if name.lower() == "connection"
        for token in value.split(",")
    }
    out: dict[str, str] = {}
    for name, value in items:
        lower = name.lower()
        if lower not in REQUEST_DROP and lower not in listed and not lower.startswith("x-forwarded"):
            out[name] = value
    if upstream_key:
        out["Authorization"] = f"Bearer {upstream_key}"
    out["X-Request-ID"] = request_id
    out["Accept-Encoding"] = "identity"
    return out
