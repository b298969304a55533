"""A request's way to the parts the server's start-up hooks published (`conveyor.parts`)."""

from __future__ import annotations

from starlette.requests import HTTPConnection

from conveyor.parts import Parts


def parts_of(connection: HTTPConnection) -> Parts:
    """The parts of the server serving this request or socket; none (an empty registry) on an app that no
    server assembled, so a route answers as it does while its part is not published yet."""
    parts = getattr(getattr(connection.app.state, "server", None), "parts", None)
    return parts if isinstance(parts, Parts) else Parts()
