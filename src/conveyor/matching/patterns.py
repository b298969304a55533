"""Compiled glob/regex matching for filter lists and paths, cached because the same patterns recur per event."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from functools import lru_cache

from wcmatch import fnmatch, glob

from conveyor.lockfile.models import LabelMatcherEntry, PatternEntry

GLOB_FLAGS = glob.GLOBSTAR | glob.BRACE | glob.DOTMATCH | glob.CASE | glob.FORCEUNIX
LABEL_GLOB_FLAGS = fnmatch.BRACE | fnmatch.CASE | fnmatch.FORCEUNIX
Matcher = Callable[[str], object]


def _joined(regexes: list[str], flags: int = 0) -> re.Pattern[str]:
    return re.compile("|".join(f"(?:{regex})" for regex in regexes), flags)


@lru_cache(maxsize=65536)
def compiled_filter(kind: str, pattern: str, flags: str) -> Matcher:
    """A matcher for one filter pattern: wcmatch glob (`*` within a segment, `**` across) or regex full match.

    Globs go through wcmatch's own translation to a regex; calling the regex directly is several times faster
    than wcmatch's matcher objects, and equivalent for pure string matching (no filesystem access).
    """
    if kind == "regex":
        return re.compile(pattern, re.IGNORECASE if flags == "i" else 0).fullmatch
    includes, _ = glob.translate(pattern, flags=GLOB_FLAGS)
    return _joined(includes).fullmatch


@lru_cache(maxsize=65536)
def compiled_label(kind: str, pattern: str, flags: str) -> Matcher:
    """A matcher for one label matcher: exact, fnmatch glob (`*` crosses `:`), or regex full match."""
    if kind == "exact":
        return pattern.__eq__
    if kind == "glob":
        includes, _ = fnmatch.translate(pattern, flags=LABEL_GLOB_FLAGS)
        return _joined(includes).fullmatch
    return re.compile(pattern, re.IGNORECASE if flags == "i" else 0).fullmatch


def pattern_matches(entry: PatternEntry, value: str) -> bool:
    """Whether one filter entry (ignoring its negation) matches `value`."""
    return bool(compiled_filter(entry.kind, entry.pattern, entry.flags)(value))


def label_matches(entry: LabelMatcherEntry, label: str) -> bool:
    """Whether one label matcher matches `label`."""
    return bool(compiled_label(entry.kind, entry.pattern, entry.flags)(label))


def describe_pattern(entry: PatternEntry) -> str:
    """Human form: `glob 'main'`, `regex 'release/\\d+'`, `'!glob'`."""
    prefix = "!" if entry.negate else ""
    return f"{entry.kind} '{prefix}{entry.pattern}'" + (" (ignore case)" if entry.flags == "i" else "")


class CompiledPatterns:
    """A filter list compiled once: exclusions and inclusions with their human descriptions."""

    __slots__ = ("excludes", "includes", "shown")

    def __init__(self, entries: Sequence[PatternEntry]) -> None:
        compiled = [
            (compiled_filter(e.kind, e.pattern, e.flags), describe_pattern(e), e.negate) for e in entries
        ]
        self.excludes = tuple((match, text) for match, text, negate in compiled if negate)
        self.includes = tuple((match, text) for match, text, negate in compiled if not negate)
        # The failure details name the first five includes; joined once, as lists are decided per event.
        more = f" and {len(self.includes) - 5} more" if len(self.includes) > 5 else ""
        self.shown = (", ".join(text for _, text in self.includes[:5]), more)

    def verdict(self, value: str | None) -> tuple[bool, str]:
        """docs/design/authoring.md §5 rule 3: fails if any negation matches; else passes if no includes or
        any include matches.

        A null value fails any non-empty list.
        """
        if value is None:
            return False, "value is missing (null)"
        for match, text in self.excludes:
            if match(value):
                return False, f"'{value}' is excluded by {text}"
        if not self.includes:
            return True, f"'{value}' is not excluded"
        for match, text in self.includes:
            if match(value):
                return True, f"'{value}' matches {text}"
        return False, self.no_include_matches(value)

    def no_include_matches(self, value: str) -> str:
        """The failed `verdict` detail when no include matches `value` (shared with the indexed matcher)."""
        shown, more = self.shown
        return f"'{value}' matches none of {shown}{more}"

    def paths_verdict(self, changed_files: Sequence[str] | None) -> tuple[bool, str]:
        """docs/design/authoring.md §5 rule 5: unknown files pass; exclusions win; with no includes any
        remaining file passes."""
        if changed_files is None:
            return True, "changed files unknown"
        if not changed_files:
            return False, "no changed files"
        excludes = self.excludes
        remaining = [path for path in changed_files if not any(match(path) for match, _ in excludes)]
        if not remaining:
            return False, f"all {len(changed_files)} changed files excluded"
        if not self.includes:
            return True, f"{len(remaining)} changed file(s) not excluded, e.g. '{remaining[0]}'"
        for path in remaining:
            for match, text in self.includes:
                if match(path):
                    return True, f"'{path}' matches {text}"
        return False, self.no_path_matches(len(remaining))

    def no_path_matches(self, count: int) -> str:
        """The failed `paths_verdict` detail when none of `count` files matches an include."""
        return f"none of {count} changed file(s) matches {self.shown[0]}"


def pattern_list_verdict(entries: Sequence[PatternEntry], value: str | None) -> tuple[bool, str]:
    """Match a value against a filter list (see `CompiledPatterns.verdict`)."""
    return CompiledPatterns(entries).verdict(value)


def paths_verdict(entries: Sequence[PatternEntry], changed_files: Sequence[str] | None) -> tuple[bool, str]:
    """Match changed files against a paths filter (see `CompiledPatterns.paths_verdict`)."""
    return CompiledPatterns(entries).paths_verdict(changed_files)
