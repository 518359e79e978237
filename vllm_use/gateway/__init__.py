"""The inference gateway `/v1` (docs/gateway.md): proxying, model aliases, resumable streams, audit."""
