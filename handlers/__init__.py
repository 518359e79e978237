"""Tornado adapters: one module per surface (api, mcp, static/health); the core lives in vllm_use."""
