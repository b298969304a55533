"""Evaluating an org's global workflows for one delivery (docs/design/global_workflows.md §4).

The pipeline asks after its own workflows are matched. The round is bounded: the registration index's load by
`global_eval_wait_timeout_ms`, each candidate by `global_eval_candidate_timeout_ms`, the whole round by
`global_eval_round_timeout_ms`; whatever does not finish in time is listed in `skipped_global` with the reason,
and the delivery's own runs go ahead. Compiled candidates are kept in an LRU of `global_eval_cache_max`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from conveyor.db.engine import Database
from conveyor.events.registrations import GLOBAL_KIND, IndexCache, Registration, RegistrationIndex
from conveyor.lockfile import WorkflowEntry
from conveyor.matching import Event
from conveyor.matching.matcher import CompiledWorkflow
from conveyor.matching.patterns import compiled_filter

log = logging.getLogger(__name__)

ROUND_TIMEOUT = "global_eval_round_timeout_ms"
CANDIDATE_TIMEOUT = "global_eval_candidate_timeout_ms"
CACHE_MAX = "global_eval_cache_max"
WAIT_TIMEOUT = "global_eval_wait_timeout_ms"
# Test hooks, honoured only with CONVEYOR_TEST_MODE=1: candidates of these workflow names never finish their
# evaluation, and the registration index's load never finishes (so only the timeouts end them).
HANG_VARIABLE = "CONVEYOR_TEST_GLOBAL_EVAL_HANG"
HANG_LOAD_VARIABLE = "CONVEYOR_TEST_GLOBAL_EVAL_HANG_LOAD"


@dataclass(frozen=True)
class GlobalKnobs:
    """The four knobs' values for one round."""

    round_timeout_ms: int
    candidate_timeout_ms: int
    cache_max: int
    wait_timeout_ms: int


@dataclass(frozen=True)
class GlobalMatch:
    """A global workflow whose run the delivery creates."""

    source: str
    registration_id: str
    commit_sha: str | None
    entry: WorkflowEntry
    trace: dict[str, Any]

    @property
    def required(self) -> bool:
        """Whether its status gates the triggering commit."""
        return bool(self.entry.global_ and self.entry.global_.required)


@dataclass
class GlobalRound:
    """What one delivery's round found: runs to create, the trace entries, the skipped candidates."""

    matched: list[GlobalMatch] = field(default_factory=list)
    trace: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[dict[str, str]] = field(default_factory=list)


@dataclass(frozen=True)
class CompiledGlobal:
    """A candidate's compiled form: its `global_repos` matchers and its triggers."""

    repos: tuple[tuple[str, Callable[[str], object]], ...]
    workflow: CompiledWorkflow

    def covered_by(self, routing_key: str) -> str | None:
        """The first glob covering `routing_key`, or None."""
        return next((glob for glob, matches in self.repos if matches(routing_key)), None)


def compile_global(entry: WorkflowEntry) -> CompiledGlobal:
    """Compile a global workflow's routing-key globs (wcmatch, as branch filters) and its triggers."""
    globs = entry.global_.repos if entry.global_ else []
    return CompiledGlobal(
        repos=tuple((glob, compiled_filter("glob", glob, "")) for glob in globs),
        workflow=CompiledWorkflow(entry),
    )


def candidates_of(
    index: RegistrationIndex, org_id: str, sources: Sequence[str], routing_key: str, repo: str
) -> list[Registration]:
    """The org's enabled global registrations of a current policy source, except the triggering
    repository's own, in id order."""
    return [
        registration
        for registration in index.candidates(org_id, GLOBAL_KIND)
        if registration.routing_key in sources
        and not (registration.routing_key == routing_key and registration.repo == repo)
    ]


class CompiledCache:
    """An LRU of compiled candidates keyed by (registration id, `updated_at`); `compiles` counts misses."""

    def __init__(self) -> None:
        self._entries: OrderedDict[tuple[str, datetime], CompiledGlobal] = OrderedDict()
        self.compiles = 0

    def get(self, registration: Registration, limit: int) -> CompiledGlobal:
        """The compiled candidate, compiled on a miss; the least recently used beyond `limit` are dropped."""
        key = (registration.id, registration.updated_at)
        found = self._entries.get(key)
        if found is not None:
            self._entries.move_to_end(key)
            return found
        compiled = compile_global(registration.entry)
        self.compiles += 1
        self._entries[key] = compiled
        while len(self._entries) > max(limit, 1):
            self._entries.popitem(last=False)
        return compiled

    def __len__(self) -> int:
        return len(self._entries)


def _skipped(name: str, source: str, reason: str) -> dict[str, str]:
    return {"workflow": name, "source": source, "reason": reason}


class GlobalEvaluator:
    """One coordinator's evaluation of global workflows for the pipeline's deliveries."""

    def __init__(
        self,
        db: Database,
        *,
        global_sources: Callable[[str], Awaitable[tuple[str, ...]]],
        knobs: Callable[[], Awaitable[GlobalKnobs]],
        environ: Mapping[str, str],
    ) -> None:
        self._db = db
        self._global_sources = global_sources
        self._knobs = knobs
        self._index = IndexCache()
        self.cache = CompiledCache()
        test_mode = environ.get("CONVEYOR_TEST_MODE") == "1"
        hang = environ.get(HANG_VARIABLE, "") if test_mode else ""
        self._hang = frozenset(name for name in hang.split(",") if name)
        self._hang_load = test_mode and environ.get(HANG_LOAD_VARIABLE) == "1"

    async def evaluate(self, org_id: str, routing_key: str, event: Event) -> GlobalRound | None:
        """The round for one delivery; None (no query at all) when the org has no policy sources."""
        sources = await self._global_sources(org_id)
        if not sources:
            return None
        knobs = await self._knobs()
        result = GlobalRound()
        try:
            index = await asyncio.wait_for(self._load(), knobs.wait_timeout_ms / 1000)
        except TimeoutError:
            reason = f"global registrations not loaded within global_eval_wait_timeout_ms ({knobs.wait_timeout_ms} ms)"
            result.skipped.append(_skipped("*", "*", reason))
            return result
        candidates = candidates_of(index, org_id, sources, routing_key, event.repo)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + knobs.round_timeout_ms / 1000
        for registration in candidates:
            remaining = deadline - loop.time()
            if remaining <= 0:
                result.skipped.append(self._timed_out(registration, ROUND_TIMEOUT, knobs.round_timeout_ms))
                continue
            candidate_s = knobs.candidate_timeout_ms / 1000
            try:
                await asyncio.wait_for(
                    self._one(registration, routing_key, event, knobs.cache_max, result),
                    min(candidate_s, remaining),
                )
            except TimeoutError:
                if candidate_s <= remaining:
                    skipped = self._timed_out(registration, CANDIDATE_TIMEOUT, knobs.candidate_timeout_ms)
                else:
                    skipped = self._timed_out(registration, ROUND_TIMEOUT, knobs.round_timeout_ms)
                result.skipped.append(skipped)
        if result.skipped:
            log.warning("global workflows skipped for %s: %s", routing_key, result.skipped)
        return result

    @staticmethod
    def _timed_out(registration: Registration, knob: str, value: int) -> dict[str, str]:
        return _skipped(
            registration.workflow_name, registration.routing_key, f"evaluation exceeded {knob} ({value} ms)"
        )

    async def _load(self) -> RegistrationIndex:
        if self._hang_load:
            await asyncio.Event().wait()
        async with self._db.read() as conn:
            return await self._index.get(conn)

    async def _one(
        self, registration: Registration, routing_key: str, event: Event, cache_max: int, result: GlobalRound
    ) -> None:
        if registration.workflow_name in self._hang:
            await asyncio.Event().wait()
        started = time.perf_counter()
        compiled = self.cache.get(registration, cache_max)
        glob = compiled.covered_by(routing_key)
        base = {"source": registration.routing_key, "registration_id": registration.id}
        if glob is None:
            globs = ", ".join(g for g, _ in compiled.repos)
            check = {
                "filter": "global_repos",
                "ok": False,
                "detail": f"'{routing_key}' matches none of {globs}",
            }
            result.trace.append(
                {**base, "workflow": registration.workflow_name, "matched": False, "global_repos": check}
            )
            return
        decision = compiled.workflow.decide(event, None).as_dict()
        check = {"filter": "global_repos", "ok": True, "detail": f"'{routing_key}' matches glob '{glob}'"}
        entry = {**decision, **base, "global_repos": check}
        result.trace.append(entry)
        log.debug(
            "global candidate %s evaluated in %.3f ms",
            registration.id,
            (time.perf_counter() - started) * 1000,
        )
        if decision["matched"]:
            result.matched.append(
                GlobalMatch(
                    source=registration.routing_key,
                    registration_id=registration.id,
                    commit_sha=registration.commit_sha,
                    entry=registration.entry,
                    trace=entry,
                )
            )
