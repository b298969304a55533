"""Conveyor: self-hosted CI/CD whose workflows are Python code.

`from conveyor import workflow, job, step, push, ...` is the authoring API (`conveyor.sdk`). Importing this
package loads only the SDK, never server code.
"""

from conveyor.sdk import *  # noqa: F403 - the SDK is the package's public surface
from conveyor.sdk import __all__ as __all__
