"""The indexed matcher: `match_workflows(lock, event)` with a lock's triggers indexed once per lock content.

The reference matcher (`matcher.match_workflows_reference`) evaluates every trigger of every workflow for
every event, so a push to a monorepo of N workflows costs N branch and path verdicts. Here a lock is
compiled once per content hash into a `LockIndex`:

- push and tag triggers' branch / tag filter lists are deduplicated; literal globs (`main`,
  `release/1.0`) go into a dict from name to the lists that spell it, and the lists that cannot be
  decided by a dict lookup (a glob with magic, a regex, a negation) into a list checked per event. So each
  distinct list is decided once per event, and a list of literals not naming the branch fails without
  running a pattern;
- push triggers' `paths` includes are indexed by their literal first path segment (`svc3/**` under
  `svc3`): only the workflows whose includes could match one of the changed files' first segments, and
  those whose paths filter cannot be indexed (a negation, a magic first segment, a regex), are
  *candidates* evaluated in full for the event.

Every other workflow's decision is a function of the event's signature alone (type, branch or tag,
number of changed files), so those decisions are built once per signature and reused: a push then costs
the candidates' verdicts plus a tuple copy. The decisions and traces are exactly the reference matcher's
(the equivalence tests compare them over generated locks and events); other event types go through the
compiled workflows of the index, as the reference does.
"""

from __future__ import annotations

import hashlib
import re
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from conveyor.lockfile.models import Lock, PatternEntry, PushTriggerEntry, TagTriggerEntry
from conveyor.matching.event import Event, event_summary
from conveyor.matching.matcher import CompiledWorkflow, type_mismatch
from conveyor.matching.patterns import CompiledPatterns
from conveyor.matching.trace import Check, Decision, TriggerDecision, WorkflowDecision

# Characters that are never glob syntax for wcmatch with the flags `patterns.GLOB_FLAGS` uses.
_PLAIN = re.compile(r"[A-Za-z0-9_.-]+")
_SLASHES = re.compile(r"/+")
# Locks indexed at once (the pipeline's lock cache holds more raw locks; an index is rebuilt on a miss).
INDEX_CACHE_SIZE = 32
# Event signatures whose non-candidate decisions one index keeps (each holds one decision per workflow).
SIGNATURE_CACHE_SIZE = 8


def lock_digest(raw: bytes) -> str:
    """The content hash an index is cached under: SHA-256 of the lock file's bytes."""
    return hashlib.sha256(raw).hexdigest()


def _plain_segments(pattern: str) -> list[str] | None:
    segments = pattern.split("/")
    if all(_PLAIN.fullmatch(segment) and segment not in (".", "..") for segment in segments):
        return segments
    return None


def literal_name(entry: PatternEntry) -> str | None:
    """The one name a glob include stands for, or None when the entry needs its compiled pattern.

    Only globs made of plain characters qualify; a case flag is left to the compiled pattern so that
    the index never has to know how it is honoured.
    """
    if entry.kind != "glob" or entry.flags or entry.negate:
        return None
    return entry.pattern if _plain_segments(entry.pattern) is not None else None


def name_key(value: str) -> str:
    """The dict key a branch or tag is looked up under.

    wcmatch lets a literal glob match repeated and trailing separators (`main` matches `main/`,
    `release/1` matches `release//1`), so the key folds them the same way.
    """
    return _SLASHES.sub("/", value).rstrip("/")


def literal_head(entry: PatternEntry) -> str | None:
    """The literal first path segment every path a paths include matches must start with, if any."""
    if entry.kind != "glob" or entry.flags or entry.negate:
        return None
    head = entry.pattern.split("/", 1)[0]
    return head if _PLAIN.fullmatch(head) and head not in (".", "..") else None


def path_head(path: str) -> str:
    """A changed file's first path segment (the key `literal_head` indexes under)."""
    return path.split("/", 1)[0]


class _NameFilters:
    """The distinct branch (or tag) filter lists of one trigger type, indexed by literal name."""

    __slots__ = ("by_key", "checked", "filter", "ids", "lists")

    def __init__(self, filter_name: str) -> None:
        self.filter = filter_name
        self.lists: list[CompiledPatterns] = []
        self.ids: dict[tuple[tuple[str, str, str, bool], ...], int] = {}
        # Literal name -> ids of lists made only of literal includes that contain it.
        self.by_key: dict[str, list[int]] = {}
        # Ids of lists a dict lookup cannot decide: any negation or any non-literal include.
        self.checked: list[int] = []

    def add(self, entries: Sequence[PatternEntry]) -> int:
        key = tuple((e.kind, e.pattern, e.flags, e.negate) for e in entries)
        found = self.ids.get(key)
        if found is not None:
            return found
        list_id = self.ids[key] = len(self.lists)
        self.lists.append(CompiledPatterns(entries))
        names = [literal_name(entry) for entry in entries]
        if any(name is None for name in names):
            self.checked.append(list_id)
        else:
            for name in dict.fromkeys(name for name in names if name is not None):
                self.by_key.setdefault(name, []).append(list_id)
        return list_id

    def checks(self, value: str | None) -> list[Check]:
        """One check per distinct list for this event's branch or tag, patterns run only where needed."""
        if value is None:
            return [Check(self.filter, *compiled.verdict(None)) for compiled in self.lists]
        # A list of literals that does not name the value cannot match it: no pattern needs to run.
        checks = [Check(self.filter, False, compiled.no_include_matches(value)) for compiled in self.lists]
        for list_id in (*self.checked, *self.by_key.get(name_key(value), ())):
            checks[list_id] = Check(self.filter, *self.lists[list_id].verdict(value))
        return checks


@dataclass(frozen=True, slots=True)
class _RefTrigger:
    """A push or tag trigger's place in the index: its name-filter list and its paths filter."""

    index: int
    name_list: int | None
    paths: CompiledPatterns | None


class LockIndex:
    """A lock's triggers compiled and indexed; build through `index_lock` so it is built once per lock."""

    __slots__ = (
        "always_candidates",
        "branches",
        "by_head",
        "layouts",
        "schema_version",
        "signatures",
        "tags",
        "workflows",
    )

    def __init__(self, lock: Lock) -> None:
        self.schema_version = lock.schema_version
        self.workflows = tuple(CompiledWorkflow(workflow) for workflow in lock.workflows)
        self.branches = _NameFilters("branches")
        self.tags = _NameFilters("patterns")
        # Per event type ("push"/"tag") and workflow position with such a trigger: each trigger's index,
        # type and, when of that type, its place in the index.
        self.layouts: dict[str, dict[int, tuple[tuple[int, str, _RefTrigger | None], ...]]] = {
            "push": {},
            "tag": {},
        }
        # First path segment -> positions of workflows with a push include under it.
        self.by_head: dict[str, set[int]] = {}
        # Positions of workflows with a paths filter the head index cannot narrow (evaluated for every
        # push that lists changed files).
        self.always_candidates: set[int] = set()
        self.signatures: OrderedDict[tuple[object, ...], tuple[WorkflowDecision, ...]] = OrderedDict()
        for position, workflow in enumerate(lock.workflows):
            refs: dict[int, _RefTrigger] = {}
            for index, trigger in enumerate(workflow.triggers):
                if isinstance(trigger, PushTriggerEntry):
                    refs[index] = self._push_trigger(position, index, trigger)
                elif isinstance(trigger, TagTriggerEntry):
                    name_list = self.tags.add(trigger.patterns) if trigger.patterns else None
                    refs[index] = _RefTrigger(index, name_list, None)
            for event_type, layouts in self.layouts.items():
                if any(trigger.type == event_type for trigger in workflow.triggers):
                    layouts[position] = tuple(
                        (index, trigger.type, refs[index] if trigger.type == event_type else None)
                        for index, trigger in enumerate(workflow.triggers)
                    )

    def _push_trigger(self, position: int, index: int, trigger: PushTriggerEntry) -> _RefTrigger:
        name_list = self.branches.add(trigger.branches) if trigger.branches else None
        if not trigger.paths:
            return _RefTrigger(index, name_list, None)
        heads = [literal_head(entry) for entry in trigger.paths]
        # An exclusion makes the verdict depend on every file; an include without a literal head could
        # match any file: both are evaluated in full whenever the push lists its changed files.
        if any(head is None for head in heads):
            self.always_candidates.add(position)
        else:
            for head in heads:
                assert head is not None
                self.by_head.setdefault(head, set()).add(position)
        return _RefTrigger(index, name_list, CompiledPatterns(trigger.paths))

    def candidates(self, event: Event) -> set[int]:
        """Positions of workflows whose push decision may depend on the changed files themselves."""
        files = event.changed_files
        if not files:
            # Unknown or no changed files: every paths verdict is the same for all of them.
            return set()
        found = set(self.always_candidates)
        for head in {path_head(path) for path in files}:
            found.update(self.by_head.get(head, ()))
        return found

    def _signature_decisions(self, event: Event) -> tuple[WorkflowDecision, ...]:
        """Each workflow's decision assuming no paths include matches: a function of the signature only."""
        is_push = event.type == "push"
        signature = (event.type, event.branch if is_push else event.tag, _files_state(event.changed_files))
        cached = self.signatures.get(signature)
        if cached is not None:
            self.signatures.move_to_end(signature)
            return cached
        names = self.branches if is_push else self.tags
        name_checks = names.checks(event.branch if is_push else event.tag)
        layouts = self.layouts[event.type]
        decisions = []
        for position, workflow in enumerate(self.workflows):
            layout = layouts.get(position)
            if layout is None:
                decisions.append(workflow.decide(event, None))
                continue
            decisions.append(_ref_decision(workflow.name, layout, event, name_checks))
        built = tuple(decisions)
        self.signatures[signature] = built
        if len(self.signatures) > SIGNATURE_CACHE_SIZE:
            self.signatures.popitem(last=False)
        return built

    def decide(self, event: Event, subscriber_repo: str | None = None) -> tuple[WorkflowDecision, ...]:
        """Every workflow's decision for the event, as `match_workflows_reference` gives it."""
        if event.type not in ("push", "tag") or event.action == "deleted":
            return tuple(workflow.decide(event, subscriber_repo) for workflow in self.workflows)
        decisions = self._signature_decisions(event)
        candidates = self.candidates(event) if event.type == "push" else set()
        if not candidates:
            return decisions
        replaced = list(decisions)
        for position in candidates:
            replaced[position] = self.workflows[position].decide(event, subscriber_repo)
        return tuple(replaced)


def _files_state(files: list[str] | None) -> int | None:
    return None if files is None else len(files)


def _paths_check(paths: CompiledPatterns, files: list[str] | None) -> Check:
    if not files:
        return Check("paths", *paths.paths_verdict(files))
    # Not a candidate: no exclusion and no include under any changed file's first segment.
    return Check("paths", False, paths.no_path_matches(len(files)))


def _ref_decision(
    name: str,
    layout: tuple[tuple[int, str, _RefTrigger | None], ...],
    event: Event,
    name_checks: list[Check],
) -> WorkflowDecision:
    """A workflow's decision for a non-deleted push or tag from the shared name checks, no paths matching.

    Built for every workflow when a signature is first seen, so it avoids per-trigger lookups.
    """
    results: list[TriggerDecision] = []
    first = None
    for index, trigger_type, trigger in layout:
        if trigger is None:
            results.append(type_mismatch(index, trigger_type, event.type))
            continue
        checks: tuple[Check, ...] = ()
        if trigger.name_list is not None:
            checks = (name_checks[trigger.name_list],)
        if trigger.paths is not None:
            checks = (*checks, _paths_check(trigger.paths, event.changed_files))
        matched = True
        for check in checks:
            if not check.ok:
                matched = False
                break
        if matched and first is None:
            first = index
        results.append(TriggerDecision(index, trigger_type, matched, checks))
    return WorkflowDecision(name, first is not None, first, tuple(results))


_INDEXES: OrderedDict[object, tuple[Lock | None, LockIndex]] = OrderedDict()


def index_lock(lock: Lock, digest: str | None = None) -> LockIndex:
    """The lock's index, built once per content hash `digest` (see `lock_digest`), LRU-bounded.

    Without a digest the lock object itself is the key (held by the cache, so a recycled id can never
    alias another lock): callers that parse the same bytes again per event should pass the digest.
    """
    key: object = ("sha256", digest) if digest is not None else ("id", id(lock))
    hit = _INDEXES.get(key)
    if hit is not None and (digest is not None or hit[0] is lock):
        _INDEXES.move_to_end(key)
        return hit[1]
    index = LockIndex(lock)
    _INDEXES[key] = (None if digest is not None else lock, index)
    if len(_INDEXES) > INDEX_CACHE_SIZE:
        _INDEXES.popitem(last=False)
    return index


def match_workflows(
    lock: Lock, event: Event, *, subscriber_repo: str | None = None, digest: str | None = None
) -> Decision:
    """Match an event against every workflow of a lock and return the full decision trace.

    `subscriber_repo` is the repository the lock belongs to; it decides `from_repos=None` triggers of
    cross-repo events (custom events, completions). When None, the lock is taken to be the event's repo.
    `digest` is the lock's content hash (`lock_digest` of its bytes), under which its index is cached.
    """
    index = index_lock(lock, digest)
    return Decision(
        event=event_summary(event),
        lock_status="ok",
        schema_version=index.schema_version,
        workflows=index.decide(event, subscriber_repo),
    )
