"""Conveyor: self-hosted CI/CD whose workflows are Python code.

`from conveyor import workflow, job, step, push, ...` is the authoring API (`conveyor.sdk`). Importing this
package loads only the SDK, never server code, and the SDK itself only when a name of it is first used:
`conveyor --help` and every `conveyor admin` call import `conveyor.cli`, a subpackage, and should not pay
for the SDK (a fast CLI).
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from conveyor.sdk import *  # noqa: F403 - the SDK is the package's public surface
    from conveyor.sdk import __all__ as __all__


def __getattr__(name: str) -> Any:
    """Load the SDK on first use of one of its names (and for `from conveyor import *`)."""
    import conveyor.sdk as sdk

    if name == "__all__":
        return sdk.__all__
    if name in sdk.__all__:
        value = getattr(sdk, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'conveyor' has no attribute {name!r}")
