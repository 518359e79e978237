"""What vllm-use tells about itself: `GET /metrics` and the overview's traffic (docs/observability.md)."""
