"""The vLLM runtime (S4.3): typed options, argv building, the reaper shim, the supervisor, /proc facts."""
