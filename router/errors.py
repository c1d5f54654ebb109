"""OpenAI-shaped errors: one exception type, one JSON body, mapped in one place.

Every client-visible failure is an `APIError` carrying the HTTP status and the OpenAI error
fields (`message`, `type`, `param`, `code`). The app installs handlers that turn it (and
FastAPI's own validation errors) into `{"error": {...}}`, so bad input never becomes a 500
with a stack trace. Transport-free: the HTTP response of an error is router/http/formats.py
`error_response` (dispatch raises these too, below the HTTP room).
"""

from __future__ import annotations


class APIError(Exception):
    """An error answered to the client with `status` and an OpenAI-shaped body."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error",
                 param: str | None = None, code: str | int | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code if code is not None else status
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}


def bad_request(message: str, param: str | None = None) -> APIError:
    return APIError(400, message, "invalid_request_error", param)


def unauthorized(message: str) -> APIError:
    return APIError(401, message, "authentication_error", headers={"WWW-Authenticate": "Bearer"})


def forbidden(message: str) -> APIError:
    return APIError(403, message, "permission_error")


def unavailable(message: str, retry_after_s: int = 1) -> APIError:
    return APIError(503, message, "service_unavailable", headers={"Retry-After": str(retry_after_s)})


def overloaded(message: str, retry_after_s: int = 1) -> APIError:
    return APIError(429, message, "rate_limit_exceeded", headers={"Retry-After": str(retry_after_s)})


def upstream_error(message: str) -> APIError:
    """A worker failed and no retry was possible (not the client's fault)."""
    return APIError(502, message, "upstream_error")


def stream_error_event(message: str, code: int = 502, type: str = "upstream_error") -> dict:
    """The SSE event sent when a stream fails after its first token (status 200 is already sent)."""
    return {"error": {"message": message, "type": type, "param": None, "code": code}}
