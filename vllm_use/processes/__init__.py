"""The children vllm-use starts: `children` (a new session, our working directory, one output pipe,
signals to a whole group), `die_with_parent` (the shim that gives `hf` and the probes a
parent-death signal) and `probe` (version probes of `vllm`, `hf`, `nvidia-smi`); docs/architecture.md,
"Children"."""
