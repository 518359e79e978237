"""`GET /metrics`: the Prometheus text format (docs/observability.md, "Metrics").

Auth: one Bearer key with the `metrics` scope (Surface.METRICS): the admin token and keys of other
scopes are no credential here (401, counted in `vllm_use_auth_failures_total{surface="metrics"}`
like every refusal). With `--metrics-public` no credential is asked for. The answer is never
cached (`Cache-Control: no-store`, from JsonHandler), and its errors are JSON like /api's.
"""

from __future__ import annotations

from typing import Any

import tornado.web
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

from handlers.base import JsonHandler
from vllm_use.scopes import Surface


@tornado.web.stream_request_body
class MetricsHandler(JsonHandler):
    surface = Surface.METRICS

    def initialize(self, **kwargs: Any) -> None:  # type: ignore[override]
        super().initialize(**kwargs)
        self.public = self.app.config.metrics_public

    async def get(self) -> None:
        body = await self.app.metrics.exposition(self.app)
        self.set_header("Content-Type", CONTENT_TYPE_PLAIN_0_0_4)  # what `render` writes
        self.finish(body)


def default_handlers(common: dict[str, Any]) -> list[tuple[str, type, dict[str, Any]]]:
    return [(r"/metrics", MetricsHandler, common)]
