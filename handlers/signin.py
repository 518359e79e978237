"""`GET /api/signin-hint`: where the sign-in page says the admin token is (docs/auth.md, "Where the
admin token is"; docs/security.md).

Public, since whoever needs it has no credential yet, so it reveals no secret: never the token,
only where it is. Even that is told only to a client on this machine (`tells_where`): the data
directory's path names the account and the layout of the machine, which a client elsewhere on the
network has no use for. A loopback peer is the operator (the default bind is 127.0.0.1); a request
that says it was forwarded (`Forwarded`, `X-Forwarded-For`, `X-Real-IP`) is someone else's,
relayed by a proxy on this machine, and gets the generic answer, as does any peer that is not
loopback. Behind a proxy that forwards without saying so, every client looks local: docs/security.md.

Not a registry method: the answer depends on the transport's peer address, and MCP (which needs a
key anyway) has no use for it. GET only (405 otherwise); a query parameter or a body is a 400.
"""

from __future__ import annotations

import ipaddress
import shlex
from collections.abc import Mapping
from typing import Any

import tornado.web

from handlers.base import JsonHandler
from vllm_use.config import Config
from vllm_use.errors import InvalidArguments

FORWARDING_HEADERS = ("Forwarded", "X-Forwarded-For", "X-Real-IP")
GENERIC = (
    "The admin token is in the file admin-token in the server's data directory "
    "(by default ~/.local/share/vllm-use/admin-token), unless the server was given one with "
    "VLLM_USE_ADMIN_TOKEN or --admin-token-file. Read it on the server's machine."
)


def tells_where(remote_ip: str | None, headers: Mapping[str, str]) -> bool:
    """Whether a client at `remote_ip` (the socket's peer) with these request headers may learn
    the token file's path: only a loopback peer whose request was not forwarded (module docstring)."""
    if any(name in headers for name in FORWARDING_HEADERS):
        return False
    try:
        address = ipaddress.ip_address(remote_ip or "")
    except ValueError:  # a Unix socket, or nothing: not known to be local
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback


def signin_hint(config: Config, local: bool) -> dict[str, Any]:
    """The answer: `local`, `source` (file, token_file, setting or null), the `path` and a command to
    read it (`read_with`) where there is one, and a sentence (`message`). Nothing but `local` and the
    generic sentence for a client that is not local."""
    if not local:
        return {"local": False, "source": None, "path": None, "read_with": None, "message": GENERIC}
    if config.admin_token_file is not None:
        path, source = config.admin_token_file, "token_file"
        message = "The admin token was read from this file (--admin-token-file) when the server started."
    elif config.admin_token:
        return {
            "local": True,
            "source": "setting",
            "path": None,
            "read_with": None,
            "message": "The admin token was given to the server with VLLM_USE_ADMIN_TOKEN (or --admin-token): "
            "it is the value of that variable where the server was started.",
        }
    else:
        path, source = config.bootstrap_token_path, "file"
        message = "The server created the admin token in this file at its first start (mode 0600)."
    return {
        "local": True,
        "source": source,
        "path": str(path),
        "read_with": f"cat {shlex.quote(str(path))}",
        "message": message,
    }


@tornado.web.stream_request_body
class SigninHintHandler(JsonHandler):
    public = True

    def get(self) -> None:
        if self.request.query_arguments:
            name = next(iter(self.request.query_arguments))
            self.fail(
                InvalidArguments(
                    f"invalid arguments: unknown query parameter {name!r}", errors=[{"loc": [name]}]
                )
            )
            return
        if self.body.strip():
            self.fail(
                InvalidArguments("invalid arguments: this route takes no body", errors=[{"loc": ["body"]}])
            )
            return
        local = tells_where(self.request.remote_ip, self.request.headers)
        self.write_json(signin_hint(self.app.config, local))


def default_handlers(common: dict[str, Any]) -> list[tuple[str, type, dict[str, Any]]]:
    return [(r"/api/signin-hint", SigninHintHandler, common)]
