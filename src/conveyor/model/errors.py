"""The one error shape every HTTP surface answers with: `{"error": code, "detail": sentence}`."""

from __future__ import annotations

from collections.abc import Iterable

from conveyor.errors import ConveyorError

# An error message quotes at most this many characters of any one input (a header, a path segment, a
# query value): a hostile 60,000-character value is never echoed back, or into logs, whole.
MAX_ECHO_CHARS = 100


def clip(value: str, limit: int = MAX_ECHO_CHARS) -> str:
    """`value` cut to `limit` characters, with an ellipsis when something was cut."""
    return value if len(value) <= limit else value[:limit] + "…"


def clip_echoes(detail: str, inputs: Iterable[str]) -> str:
    """`detail` with every quoted input longer than MAX_ECHO_CHARS cut to its first MAX_ECHO_CHARS."""
    for value in sorted({v for v in inputs if len(v) > MAX_ECHO_CHARS}, key=len, reverse=True):
        if value in detail:
            detail = detail.replace(value, clip(value))
    return detail


class ApiError(ConveyorError):
    """An error the HTTP layer turns into `status` with `{"error": code, "detail": detail}`."""

    def __init__(self, status: int, code: str, detail: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(detail)
        self.status = status
        self.code = code
        self.detail = detail
        self.headers = headers or {}

    def body(self) -> dict[str, str]:
        """The JSON body of the answer."""
        return {"error": self.code, "detail": self.detail}


def not_found(what: str) -> ApiError:
    """404 for a row that does not exist (or that the caller may not see)."""
    return ApiError(404, "not_found", f"{what} not found")


def conflict(code: str, detail: str) -> ApiError:
    """409: the resource's state forbids the action."""
    return ApiError(409, code, detail)


def bad_request(code: str, detail: str) -> ApiError:
    """400: a value the resource rejects."""
    return ApiError(400, code, detail)


DATABASE_RETRY_AFTER_S = 5


def unavailable(detail: str) -> ApiError:
    """503 `unavailable` with `Retry-After`: the database could not serve or store the request."""
    return ApiError(503, "unavailable", detail, {"Retry-After": str(DATABASE_RETRY_AFTER_S)})
