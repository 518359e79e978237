"""Hugging Face downloads (docs/models-and-downloads.md): task records, the durable queue of `hf`
children, their logs."""
