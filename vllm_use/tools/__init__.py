"""The tools API for the chat page (docs/tools.md): `base` (what a tool is, its bounds), `files`
(the built-in file tools), `confine` (how they stay inside --tools-root), `search` and `grep_child`
(grep_search's child process), `shell` (exec_shell_command), `mcp_tools` (tools
of MCP servers named in --tools-mcp-config) and `toolbox` (the enabled set, per-key concurrency,
time limits); `handlers/tools.py` serves them at `/tools`."""
