"""Registered models: `records` (ModelStatus, validation, rows), `files` (the managed directories,
sizes, the crash-safe delete) and `store` (every `models` and `download_tasks` query;
docs/models-and-downloads.md)."""
