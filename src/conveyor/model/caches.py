"""Dependency caches' pure rules (docs/design/caches.md §1–§2): what a key may be, the scope a run writes,
the scopes it reads, and which stored entry a lookup restores. No I/O: the server and `run local` share it."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from conveyor.model.sizes import size_text

MAX_KEY = 512
NO_SCOPE = "-"

HitKind = Literal["exact", "partial", "miss"]


def key_problem(key: object, what: str = "cache key") -> str | None:
    """Why `key` cannot be a cache key (or a restore-key prefix), or None."""
    if not isinstance(key, str) or not key:
        return f"invalid {what} {str(key)[:80]!r}: a non-empty string"
    if len(key) > MAX_KEY:
        return f"invalid {what} {key[:80]!r}…: at most {MAX_KEY} characters"
    # Printable ASCII only, and no comma: restore keys are joined with commas in logs and on the wire.
    if any(not (32 <= ord(c) < 127) or c == "," for c in key):
        return f"invalid {what} {key[:80]!r}: printable ASCII without ','"
    return None


def scope_of(event: Mapping[str, Any]) -> str:
    """The scope a run writes its entries to: its ref; else the default branch's; else `-`."""
    ref = event.get("ref")
    if isinstance(ref, str) and ref:
        return ref
    default = event.get("default_branch")
    if isinstance(default, str) and default:
        return f"refs/heads/{default}"
    return NO_SCOPE


def readable_scopes(event: Mapping[str, Any]) -> tuple[str, ...]:
    """The scopes a run reads, nearest first: its own, a pull request's base branch, the default branch.

    Never another feature branch's: that is what keeps one branch's (possibly poisoned) cache out of
    another's builds, as GitHub Actions does.
    """
    scopes = [scope_of(event)]
    base = event.get("base_branch")
    if event.get("type") == "pr" and isinstance(base, str) and base:
        scopes.append(f"refs/heads/{base}")
    default = event.get("default_branch")
    if isinstance(default, str) and default:
        scopes.append(f"refs/heads/{default}")
    return tuple(dict.fromkeys(scopes))


@dataclass(frozen=True, slots=True)
class Candidate:
    """A stored entry as the choice sees it."""

    id: str
    scope: str
    key: str
    created_at: datetime


@dataclass(frozen=True, slots=True)
class Choice:
    """What a lookup restores: `entry` is None on a miss."""

    kind: HitKind
    entry: Candidate | None


def choose_entry(
    candidates: Iterable[Candidate], key: str, restore_keys: Sequence[str], scopes: Sequence[str]
) -> Choice:
    """The entry to restore (docs/design/caches.md §2): rules in order (`key` exactly, then each restore
    key as a prefix), within a rule the scopes nearest first, within a scope the newest entry.

    Entries of scopes not in `scopes` are never chosen, whatever their key.
    """
    rank = {scope: index for index, scope in enumerate(scopes)}
    readable = [c for c in candidates if c.scope in rank]

    def best(matches: list[Candidate]) -> Candidate | None:
        if not matches:
            return None
        # Nearest scope first; then newest (created_at, then id so that equal times are still stable).
        return min(matches, key=lambda c: (rank[c.scope], _negated(c)))

    exact = best([c for c in readable if c.key == key])
    if exact is not None:
        return Choice("exact", exact)
    for prefix in restore_keys:
        found = best([c for c in readable if c.key.startswith(prefix)])
        if found is not None:
            return Choice("partial", found)
    return Choice("miss", None)


def _negated(candidate: Candidate) -> tuple[float, tuple[int, ...]]:
    return (-candidate.created_at.timestamp(), tuple(-ord(ch) for ch in candidate.id))


def step_cache_text(record: Mapping[str, Any]) -> str:
    """One step cache's outcome as the run page and `admin run show` print it (docs/design/caches.md §7):
    `KEY: miss, saved 1.2 KiB`, `KEY: exact hit`, `KEY: partial hit (OLD), not saved`.

    `kind` None: the lookup never reached the server (the step warned and went on as on a miss). A non-exact
    step that recorded no save did not commit one: the step failed, nothing existed to save, or the upload
    failed (the step's log says which)."""
    key = str(record.get("key"))
    kind = record.get("kind")
    restored = record.get("restored_key")
    if kind == "exact":
        return f"{key}: exact hit"
    if kind == "partial":
        parts = [f"partial hit ({restored})"]
    elif kind == "miss":
        parts = ["miss"]
    else:
        parts = ["not looked up"]
    saved = record.get("saved")
    if saved == "saved":
        size = record.get("saved_size")
        parts.append("saved" if size is None else f"saved {size_text(int(size))}")
    elif saved == "dropped":
        parts.append("not saved (the key exists)")
    else:
        parts.append("not saved")
    return f"{key}: {', '.join(parts)}"
