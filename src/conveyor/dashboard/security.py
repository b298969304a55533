"""Response headers of the dashboard: a strict Content-Security-Policy, no framing, no caching of pages."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

# No inline script or style, nothing from another origin, no framing (clickjacking), forms post only here.
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
_HEADERS = [
    (b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
]


def is_dashboard_path(path: str) -> bool:
    """The dashboard's own paths (pages, static files, and `/`, which redirects to it)."""
    return path == "/" or path == "/ui" or path.startswith("/ui/")


class DashboardHeaders:
    """ASGI middleware adding the security headers to every dashboard response."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not is_dashboard_path(scope["path"]):
            await self.app(scope, receive, send)
            return
        static = scope["path"].startswith("/ui/static/")

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [*message.get("headers", []), *_HEADERS]
                if not static:
                    headers.append((b"cache-control", b"no-store"))
                message["headers"] = headers
            await send(message)

        await self.app(scope, receive, with_headers)
