"""What /proc says about the runtime's processes and its port (Linux). Runs in the executor.

vLLM forks its engine (EngineCore, Worker) into its own process group, so the
supervisor reasons about groups, never one pid: `group_members` lists a group,
`port_held_by_group` proves that the socket listening on the runtime's port is
one of the group's (another local process may have taken the port while vLLM
imported, docs/runtime.md).
"""

from __future__ import annotations

import os


def _stat_fields(pid: int | str) -> list[bytes] | None:
    """The fields of /proc/<pid>/stat after `comm`: state, ppid, pgrp, … (None if it is gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # comm may hold spaces and parentheses: the fields after the last ")" are fixed.
    return stat[stat.rfind(b")") + 2 :].split()


def group_members(pgid: int) -> list[int]:
    """Live pids whose process group is `pgid` (zombies don't count: PID 1 may never reap them)."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        fields = _stat_fields(entry)
        if fields and len(fields) > 2 and int(fields[2]) == pgid and fields[0] not in (b"Z", b"X"):
            members.append(int(entry))
    return members


def child_in_group(pgid: int, parent: int) -> int | None:
    """The member of group `pgid` whose parent is `parent` (vLLM's main process under the reaper)."""
    for pid in group_members(pgid):
        fields = _stat_fields(pid)
        if fields and len(fields) > 1 and int(fields[1]) == parent:
            return pid
    return None


# /proc/net/tcp{,6} addresses (hex, in the kernel's byte order) that take connections to 127.0.0.1.
_LOOPBACK_LISTENERS = {
    "0100007F",  # 127.0.0.1
    "00000000",  # 0.0.0.0
    "00000000000000000000000000000000",  # :: (dual-stack)
    "0000000000000000FFFF00000100007F",  # ::ffff:127.0.0.1
}
_TCP_LISTEN = "0A"


def listening_inodes(port: int) -> set[int]:
    """Socket inodes LISTENing on `port` where a connection to 127.0.0.1 could land."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except FileNotFoundError:
            continue  # no IPv6 on this kernel
        for row in rows:
            fields = row.split()
            if len(fields) < 10 or fields[3] != _TCP_LISTEN:
                continue
            address, _, hex_port = fields[1].partition(":")
            if int(hex_port, 16) == port and address in _LOOPBACK_LISTENERS:
                inodes.add(int(fields[9]))
    return inodes


def socket_inodes(pids: list[int]) -> set[int]:
    """Inodes of the sockets the processes `pids` hold open (`/proc/<pid>/fd` → `socket:[N]`)."""
    inodes = set()
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue  # gone meanwhile
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(int(target[8:-1]))
    return inodes


def port_held_by_group(port: int, pgid: int) -> bool:
    """Whether every socket listening on 127.0.0.1:`port` is held by a process of group `pgid`.

    Fails closed: no listener found, or one we can't attribute to the group, is "not ours".
    """
    listening = listening_inodes(port)
    return bool(listening) and listening <= socket_inodes(group_members(pgid))
