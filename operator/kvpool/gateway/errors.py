"""Gateway errors as OpenAI-style JSON bodies, so every client SDK shows a clear message.

Every answer the gateway makes itself (never the engine's own body) is
``{"error": {"message", "type", "code", "param"}}`` with the matching status and, for
retryable ones (429, and every 503), a ``Retry-After`` header (whole seconds, at least 1).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from aiohttp import web

# error types, as OpenAI names them
INVALID_REQUEST = "invalid_request_error"
AUTHENTICATION = "authentication_error"
PERMISSION = "permission_error"
NOT_FOUND = "not_found_error"
RATE_LIMIT = "rate_limit_error"
OVERLOADED = "overloaded_error"
UPSTREAM = "upstream_error"
SERVER = "server_error"

DEFAULT_RETRY_AFTER = 1.0  # seconds, for a 503 whose cause gives no better figure


@dataclass(eq=False)
class GatewayError(Exception):
    """An answer the gateway gives instead of proxying (not frozen: Python sets exception
    attributes such as ``__traceback__`` on raise)."""

    status: int
    code: str  # a stable constant (also a metric label)
    message: str  # for humans
    type: str = INVALID_REQUEST
    retry_after: float | None = None  # seconds
    param: str | None = None  # the offending request field, if any

    def __str__(self) -> str:
        return f"{self.status} {self.code}: {self.message}"

    def body(self) -> dict[str, Any]:
        """The JSON body."""
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "code": self.code,
                "param": self.param,
            }
        }

    def headers(self) -> dict[str, str]:
        """Extra headers: Retry-After when the error is retryable. Every 503 carries one
        (``DEFAULT_RETRY_AFTER`` when the cause gives no better figure)."""
        retry_after = self.retry_after
        if retry_after is None and self.status == 503:
            retry_after = DEFAULT_RETRY_AFTER
        if retry_after is None:
            return {}
        return {"Retry-After": str(max(1, math.ceil(retry_after)))}

    def response(self) -> web.Response:
        """The aiohttp response."""
        return web.Response(
            status=self.status,
            body=json.dumps(self.body()).encode(),
            content_type="application/json",
            headers=self.headers(),
        )
