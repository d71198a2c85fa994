"""The API key: with one set, a request to /v1/... without `Authorization: Bearer KEY` is
answered 401 here, before its body is read or anything else runs. /health, /metrics and
/version stay open for probes and scrapers (as in vLLM)."""
from __future__ import annotations

import secrets

from .errors import OpenAIError

PROTECTED_PREFIX = "/v1"


class BearerAuthMiddleware:
    """Pure ASGI middleware, outside every route and body parser."""

    def __init__(self, app, api_key: str):
        self.app = app
        self._expected = f"Bearer {api_key}".encode()

    def _authorized(self, scope) -> bool:
        for name, value in scope.get("headers", ()):
            if name == b"authorization":
                return secrets.compare_digest(value, self._expected)
        return False

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"].startswith(PROTECTED_PREFIX) and not self._authorized(scope):
            refusal = OpenAIError(401, "missing or wrong API key: send the header 'Authorization: Bearer <key>'",
                                  code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
            await refusal.response()(scope, receive, send)
            return
        await self.app(scope, receive, send)
