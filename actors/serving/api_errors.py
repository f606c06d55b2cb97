"""The API's refusals and failures, in OpenAI's error shape.

A request the server cannot honour exactly, or a malformed one, is refused with a 4xx
naming the field (``param``); a call the generator could not finish, with a 503. Every
part of the API raises :class:`ApiError`; the routes (openai_api.py) turn it into the
reply, and a stream (api_streams.py) into its last event.
"""

from __future__ import annotations

from typing import Any

from starlette.responses import JSONResponse

__all__ = ["ApiError", "unfinished"]


class ApiError(Exception):
    """A request refused: an OpenAI-style error reply naming the field."""

    def __init__(self, message: str, param: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.message, self.param, self.status = message, param, status

    def body(self) -> dict[str, Any]:
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        return {"error": {"message": self.message, "type": kind, "param": self.param,
                          "code": None}}  # fmt: skip

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status)


def unfinished(error: Exception) -> ApiError:
    """The error of a call the generator dropped, or stopped decoding, before its end."""
    return ApiError(f"the generator could not finish this call: {error}", None, 503)
