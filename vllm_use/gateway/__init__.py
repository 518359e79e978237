"""The inference gateway `/v1` (S5): proxying, model aliases, resumable streams, audit."""
