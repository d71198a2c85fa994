"""Every refusal as OpenAI's error body, `{"error": {"message", "type", "param", "code"}}`, with
the status OpenAI would give: 400 for a bad request (malformed JSON, a wrong type or value, an
unknown field, a prompt over the engine's limits), 401 for a missing or wrong API key, 404 for an
unknown model or path, 503 when the queue is full or the server stops. Nothing a client sends
reaches a 500 or a traceback: a 500 means a bug here, and its traceback goes to the log only.
"""
from __future__ import annotations

from typing import Optional

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from ..errors import RequestError
from ..logger import logger
from .openai_protocol import ErrorInfo, ErrorResponse


class OpenAIError(Exception):
    """A request refused with this status and OpenAI's error body."""

    def __init__(self, status: int, message: str, *, param: Optional[str] = None, code: Optional[str] = None,
                 headers: Optional[dict[str, str]] = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers

    @property
    def type(self) -> str:
        if self.status >= 500:
            return "server_error"
        return "invalid_request_error"

    def body(self) -> ErrorResponse:
        return ErrorResponse(error=ErrorInfo(message=self.message, type=self.type, param=self.param,
                                             code=self.code))

    def response(self) -> JSONResponse:
        return JSONResponse(self.body().model_dump(), status_code=self.status, headers=self.headers)


def validation_error(errors: list[dict]) -> OpenAIError:
    """pydantic's first complaint about a body as one message naming the field."""
    first = errors[0] if errors else {"loc": (), "msg": "invalid request", "type": ""}
    loc = [str(part) for part in first.get("loc", ()) if part != "body"]
    if first.get("type") == "json_invalid":
        detail = (first.get("ctx") or {}).get("error", "")
        return OpenAIError(400, f"the body is not valid JSON ({detail})" if detail else "the body is not valid JSON")
    param = ".".join(loc) or None
    msg = first.get("msg", "invalid value").removeprefix("Value error, ")
    if first.get("type") == "extra_forbidden":
        msg = "unrecognized request argument"
    elif first.get("type") == "missing":
        msg = "required" if param else "a JSON body is required"
    return OpenAIError(400, f"{param}: {msg}" if param else msg, param=param)


def install_error_handlers(app: FastAPI) -> None:

    @app.exception_handler(OpenAIError)
    async def _openai(_request: Request, e: OpenAIError):
        return e.response()

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, e: RequestValidationError):
        return validation_error(list(e.errors())).response()

    @app.exception_handler(RequestError)
    async def _refused(_request: Request, e: RequestError):
        # The engine's own request checks (prompt length, max_tokens against max_seq_len, ...).
        return OpenAIError(400, " ".join(str(e).split())).response()

    @app.exception_handler(HTTPException)
    async def _http(_request: Request, e: HTTPException):
        message = {404: "no such path", 405: "method not allowed on this path"}.get(e.status_code, str(e.detail))
        return OpenAIError(e.status_code, message, headers=getattr(e, "headers", None)).response()

    @app.exception_handler(Exception)
    async def _bug(request: Request, e: Exception):
        logger.exception(f"{request.method} {request.url.path} failed: {type(e).__name__}: {e}")
        return OpenAIError(500, "internal server error (see the server's log)").response()
