"""The parts a running server's start-up hooks publish for routes and later hooks, found by typed keys.

A package declares a `PartKey[T]` beside the type it names (or, for a seam upward, beside a Protocol the
higher package satisfies); a hook `put`s its part under that key and a reader `get`s it back typed as `T`.
Keys are compared by identity, not by name, so two packages cannot collide on a string. The registry
lives in layer 0 because keys are declared in every layer above it (docs/design/ARCHITECTURE.md §3,
"Typed wiring").
"""

from __future__ import annotations

from typing import Generic, TypeVar, cast

from conveyor.errors import ConveyorError

T = TypeVar("T")


class PartKey(Generic[T]):
    """The key of one published part; `name` is for messages and listings only."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"PartKey({self.name!r})"


class MissingPartError(ConveyorError, LookupError):
    """A part a caller needs was never published (its hook did not run on this node)."""


class Parts:
    """What the start-up hooks of one node have published."""

    def __init__(self) -> None:
        self._values: dict[PartKey[object], object] = {}

    def put(self, key: PartKey[T], value: T) -> None:
        """Publish (or replace) the part under `key`."""
        self._values[cast(PartKey[object], key)] = value

    def get(self, key: PartKey[T]) -> T | None:
        """The part under `key`, or None when this node has none."""
        return cast("T | None", self._values.get(cast(PartKey[object], key)))

    def need(self, key: PartKey[T]) -> T:
        """The part under `key`; a node without it is a wiring error."""
        found = self.get(key)
        if found is None:
            raise MissingPartError(f"the server has no {key.name} part (its start-up hook did not run)")
        return found

    def __contains__(self, key: PartKey[object]) -> bool:
        return key in self._values
