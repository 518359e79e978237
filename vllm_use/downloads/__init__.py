"""Hugging Face downloads (S4.2): task records, the durable queue of `hf` children, their logs."""
