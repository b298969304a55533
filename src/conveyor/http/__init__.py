"""What every HTTP surface shares: the admin route dependency, the caller, the access-log entry.

It sits below the domain packages so that each can keep its admin routes in its own `routes.py`.
"""

from conveyor.http.deps import (
    AccessEntry,
    AuthorisationCheck,
    PermissionSpec,
    Principal,
    authorisation_check,
    database,
    log_write,
    require,
)

__all__ = [
    "AccessEntry",
    "AuthorisationCheck",
    "PermissionSpec",
    "Principal",
    "authorisation_check",
    "database",
    "log_write",
    "require",
]
