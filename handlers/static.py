"""`GET /healthz` and the web console: static files with the SPA fallback to index.html.

Every GET that is not /api, /mcp or /v1 serves the console, from an allow-list:
`index.html` and the files under the asset folders (`js/`, `css/`, `vendor/`).
A missing file under those is a 404 (a module the browser asked for must never be
answered with HTML), and so is any other path that names a file (a "." in its
last segment: `/package.json`, `/x/y.txt`). Any other path is a client-side
route and gets `index.html`, so routes survive a reload.

Confinement: the path (already percent-decoded by Tornado) is checked as text
before anything touches the filesystem. An empty, `.` or `..` segment (so `//`,
a leading `/` and `/js/../x`), a backslash or a NUL is a 404, never a fallback:
these are no client-side route, and answering them differently by what exists
outside `static/` would tell which files exist there. A symlink is not served,
nor a file whose resolved path leaves `static/` (a linked folder).

Caching: every file is served with `Cache-Control: no-cache` and an ETag, so the
browser revalidates each time (a 304 when unchanged) and an upgrade never shows
a stale console. The console's HTML also gets a strict Content-Security-Policy:
scripts, styles and connections from this origin only, no inline script, no
framing.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import tornado.web

import vllm_use


def static_dir() -> Path:
    """`vllm_use/static` in an installed wheel, `<repo>/static` in a checkout."""
    here = Path(vllm_use.__file__).resolve().parent
    for candidate in (here / "static", here.parent / "static"):
        if (candidate / "index.html").is_file():
            return candidate
    raise RuntimeError("the console's static files are missing (static/index.html)")


# What is served: the page and the files under these folders (an allow-list). Any other path that
# names a file (a "." in its last segment) is a 404; any other path is a client route: the page.
INDEX = "index.html"
ASSET_DIRS = ("js/", "css/", "vendor/")
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)


class HealthHandler(tornado.web.RequestHandler):
    """Liveness only, no auth."""

    def set_default_headers(self) -> None:
        super().set_default_headers()
        self.set_header("Cache-Control", "no-store")

    def get(self) -> None:
        self.write({"status": "ok"})


class ConsoleHandler(tornado.web.StaticFileHandler):
    """Static files under static/, falling back to index.html for unknown paths."""

    def initialize(self, path: str, default_filename: str | None = "index.html", **kwargs: Any) -> None:
        super().initialize(path=path, default_filename=default_filename)

    async def get(self, path: str, include_body: bool = True) -> None:
        if not is_plain_path(path):
            raise tornado.web.HTTPError(404)
        console_file = path == INDEX or path.startswith(ASSET_DIRS)
        if not console_file and "." in path.rsplit("/", 1)[-1]:
            raise tornado.web.HTTPError(404)  # a file, but none of the console's
        full = os.path.join(self.root, path)
        inside = os.path.realpath(full).startswith(os.path.realpath(self.root) + os.sep)
        if not console_file or not inside or not os.path.isfile(full) or os.path.islink(full):
            if path.startswith(ASSET_DIRS):
                raise tornado.web.HTTPError(404)
            path = INDEX
        await super().get(path, include_body)

    def set_extra_headers(self, path: str) -> None:
        super().set_extra_headers(path)
        self.set_header("X-Content-Type-Options", "nosniff")
        self.set_header("Cache-Control", "no-cache")
        self.set_header("Referrer-Policy", "no-referrer")
        if path.endswith(".html"):
            self.set_header("Content-Security-Policy", CSP)
            self.set_header("X-Frame-Options", "DENY")

    @classmethod
    def get_cache_time(cls, path: str, modified: Any, mime_type: str) -> int:
        return 0  # replaces the base's policy: always revalidate (module docstring)


def is_plain_path(path: str) -> bool:
    """Whether `path` (relative to static/, decoded) names something inside it: no empty, `.` or
    `..` segment, no backslash, no NUL. A trailing `/` is allowed (a folder's index)."""
    if "\\" in path or "\x00" in path:
        return False
    if not path:
        return True
    segments = path.removesuffix("/").split("/")
    return all(segment not in ("", ".", "..") for segment in segments)


def health_handlers() -> list[tuple[str, type, dict[str, Any]]]:
    return [(r"/healthz", HealthHandler, {})]


def default_handlers() -> list[tuple[str, type, dict[str, Any]]]:
    return [(r"/(.*)", ConsoleHandler, {"path": str(static_dir())})]
