"""The one error shape every HTTP surface answers with: `{"error": code, "detail": sentence}`."""

from __future__ import annotations


class ApiError(Exception):
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
