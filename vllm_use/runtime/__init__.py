"""The vLLM runtime (docs/runtime.md): typed options, argv building, the reaper shim, the supervisor,
/proc facts."""
