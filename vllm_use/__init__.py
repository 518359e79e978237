"""vllm-use: one process that runs a local vLLM server safely."""

__version__ = "0.1.0"
