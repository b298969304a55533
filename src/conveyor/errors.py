"""The root of the exceptions Conveyor raises on purpose.

`except ConveyorError` catches a refusal, a bad input or an unavailable dependency that Conveyor
itself reported, and lets a bug (`TypeError`, `AttributeError`, …) through. Classes that are also a
builtin kind (`ValueError`, `KeyError`, `RuntimeError`) keep it as a second base, so callers that
catch the builtin still do.
"""

from __future__ import annotations


class ConveyorError(Exception):
    """An error Conveyor raises deliberately (see the module docstring)."""
