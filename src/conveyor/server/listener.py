"""The server's listening socket, bound before anything else happens.

`conveyor up` on a taken port used to create the database, a secret key and an owner token, then fail
with uvicorn's raw bind error. Binding first (and handing the socket to uvicorn) makes a taken port a
one-line refusal that changes nothing, and leaves no gap in which another process could take the port.
"""

from __future__ import annotations

import errno
import socket

from conveyor.errors import ConveyorError


class PortUnavailable(ConveyorError):
    """The address cannot be listened on; the message says what to do."""


def bind_listener(host: str, port: int) -> socket.socket:
    """A bound TCP socket for `host:port` (as uvicorn would bind it), or `PortUnavailable`."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family=family, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise PortUnavailable(unavailable_message(host, port, exc)) from None
    sock.set_inheritable(True)
    return sock


def unavailable_message(host: str, port: int, exc: OSError) -> str:
    """One line: which address, why, and how to choose another."""
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    change = "pass --port N (or set CONVEYOR_PORT)"
    if exc.errno == errno.EADDRINUSE:
        return (
            f"{where} is already in use (another Conveyor, or another program, listens there); "
            f"stop it, or {change}"
        )
    if exc.errno == errno.EACCES:
        return f"{where} needs privileges this process lacks; {change} (above 1023)"
    if exc.errno == errno.EADDRNOTAVAIL:
        return f"{where}: {host} is not an address of this machine; pass --host (or set CONVEYOR_HOST)"
    return f"cannot listen on {where}: {exc.strerror or exc}; {change}"
