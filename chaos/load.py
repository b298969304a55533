"""The load: signed webhooks at a set rate across several `git` sources and a `generic` one, plus cancels
and operator events, each recorded in the history with the answer it got (docs/design/execution.md §1).

Webhooks go to a coordinator picked at random (a load balancer); a connection error or timeout is retried
once on the other coordinator with the same delivery id, which is safe because the delivery id dedups.
What a webhook should start is recorded with it (`expect`), so the checker can tell a lost run from a
webhook that was never meant to start one.
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import json
import random
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from chaos.cluster import SCALER_LABELS, ChaosCluster
from chaos.recorder import Recorder
from chaos.workflows import workflow_files
from tests.support.repos import commit_all, git, make_repo, write_workflows
from tests.support.waiting import wait_until

SECRET = "chaos-webhook-secret-0123456789"
SIGNATURE_HEADER = "X-Gitea-Signature"
REPOS = ("r1", "r2", "r3")
GENERIC = "hooks"
NULL_SHA = "0" * 40
# Webhooks awaiting an answer at once (a busy machine answers in seconds: 20/s × 8 s is 160); past that a
# tick is shed and counted, so a frozen cluster cannot pile up a backlog that goes on after the run's end.
MAX_IN_FLIGHT = 256


@dataclass
class Mix:
    """Shares of the webhook kinds (the rest are pushes to branches no workflow watches)."""

    main: float = 0.03  # a push to main: one `ci` run of 5 jobs
    resend: float = 0.05  # an earlier delivery sent again: 200 duplicate
    generic: float = 0.01  # a generic webhook: an event, then a `hook` run
    ignored: float = 0.05  # an event no provider handles: stored and ignored
    skip: float = 0.02  # a push to main with [skip ci]: processed, no run


class LoadGenerator:
    """Sends the load from a background thread until `stop()`."""

    def __init__(
        self, cluster: ChaosCluster, recorder: Recorder, work: Path, *, rate: float, seed: int, mix: Mix
    ) -> None:
        self.cluster = cluster
        self.recorder = recorder
        self.work = work
        self.rate = rate
        self.rng = random.Random(seed * 7919 + 1)
        self.mix = mix
        self.ledger = work / "ledger.jsonl"
        self.sources: dict[str, str] = {}  # name -> id
        self.main_shas: dict[str, list[str]] = {}
        self.acked: list[dict[str, Any]] = []  # bodies of accepted deliveries, for resends
        self.main_deliveries: list[tuple[str, str]] = []  # (source name, delivery row id) of main pushes
        self.sent = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=MAX_IN_FLIGHT, thread_name_prefix="webhook")
        self._in_flight = threading.Semaphore(MAX_IN_FLIGHT)
        self.shed = 0  # ticks skipped because MAX_IN_FLIGHT answers were outstanding
        self._threads: list[threading.Thread] = []
        self._counter = itertools.count()
        # One client (a pool of kept-alive connections) for all webhooks: a client per request would build
        # an SSL context and a connection each time, which costs more than the request on a busy machine.
        self._http = httpx.Client(
            timeout=8, limits=httpx.Limits(max_connections=MAX_IN_FLIGHT, max_keepalive_connections=64)
        )

    # Set-up ---------------------------------------------------------------------------------------------

    def setup(self) -> None:
        """Repositories, sources and a first push to main in each (registrations: events, cron, hooks)."""
        self.ledger.touch()
        self.ledger.chmod(0o666)
        for name in REPOS:
            repo = make_repo(self.work / "repos" / name, self._workflows(name, with_tick=True))
            shas = [git(repo, "rev-parse", "HEAD")]
            for n in range(4):
                (repo / "README.md").write_text(f"revision {n}\n")
                shas.append(commit_all(repo, f"revision {n}"))
            self.main_shas[name] = shas
            answer = self.cluster.admin(
                "POST",
                "/sources",
                {
                    "kind": "git",
                    "name": name,
                    "clone_url": f"file://{repo}",
                    "verify": "hmac",
                    "signature_header": SIGNATURE_HEADER,
                    "webhook_secret": SECRET,
                },
            )
            assert answer.status_code == 201, answer.text
            self.sources[name] = answer.json()["id"]
        answer = self.cluster.admin(
            "POST",
            "/sources",
            {
                "kind": "generic",
                "name": GENERIC,
                "signature_header": SIGNATURE_HEADER,
                "webhook_secret": SECRET,
            },
        )
        assert answer.status_code == 201, answer.text
        self.sources[GENERIC] = answer.json()["id"]
        for name in REPOS:
            self.push(name, self.main_shas[name][-1], kind="setup", expect=["ci"])
        wait_until(self._registered, timeout=120, what="the workflows registered (cron, events, hooks)")

    def _workflows(self, repo: str, *, with_tick: bool) -> dict[str, str]:
        return workflow_files(
            str(self.ledger), with_tick=with_tick, with_hook=repo == "r1", burst=SCALER_LABELS
        )

    def _registered(self) -> bool:
        answer = self.cluster.admin("GET", "/registrations")
        if answer.status_code != 200:
            return False
        names = {item.get("workflow") or item.get("workflow_name") for item in answer.json().get("items", [])}
        return {"react", "tick", "hook"} <= names

    # Sending --------------------------------------------------------------------------------------------

    def start(self) -> None:
        """Begin the webhooks, the cancels and the operator events."""
        for target in (self._webhooks, self._cancels, self._emits):
            thread = threading.Thread(target=target, daemon=True, name=target.__name__)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        """Stop sending and wait for the answers in flight."""
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=30)
        self._pool.shutdown(wait=True, cancel_futures=True)

    def close(self) -> None:
        """Close the webhook client's connections."""
        self._http.close()

    def _webhooks(self) -> None:
        interval = 1.0 / self.rate
        next_at = time.monotonic()
        while not self._stop.is_set():
            next_at += interval
            if self._in_flight.acquire(blocking=False):
                self._pool.submit(self._one_webhook)
            else:
                self.shed += 1
            delay = next_at - time.monotonic()
            if delay > 0:
                self._stop.wait(delay)
            elif delay < -5:
                next_at = time.monotonic()  # fell far behind (a frozen harness): do not burst

    def _one_webhook(self) -> None:
        try:
            self._draw_and_send()
        finally:
            self._in_flight.release()

    def _draw_and_send(self) -> None:
        with self._lock:
            draw = self.rng.random()
            repo = self.rng.choice(REPOS)
            sha = self.rng.choice(self.main_shas[repo])
            resend = self.rng.choice(self.acked) if self.acked else None
            n = next(self._counter)
        mix = self.mix
        edges = itertools.accumulate([mix.main, mix.resend, mix.generic, mix.ignored, mix.skip])
        main, resend_edge, generic, ignored, skip = edges
        try:
            if draw < main:
                self.push(repo, sha, kind="main", expect=["ci"])
            elif draw < resend_edge and resend:
                self._send(
                    resend["source"],
                    resend["headers"],
                    resend["body"],
                    kind="resend",
                    expect=None,
                    delivery_id=resend["delivery_id"],
                )
            elif draw < generic:
                body = json.dumps({"n": n, "ping": "chaos"}).encode()
                self._send(GENERIC, {"X-Gitea-Event": "chaos"}, body, kind="generic", expect=[])
            elif draw < ignored:
                body = json.dumps({"action": "opened", "issue": {"number": n}}).encode()
                self._send(repo, {"X-Gitea-Event": "issues"}, body, kind="ignored", expect=[])
            elif draw < skip:
                self.push(repo, sha, kind="skip", expect=[], message="docs [skip ci]")
            else:
                self.push(repo, sha, kind="branch", expect=[], ref=f"refs/heads/feature/{n % 50}")
        except Exception as exc:  # a harness bug must not end the load silently
            self.recorder.note("load-error", error=repr(exc))

    def push(
        self,
        repo: str,
        sha: str,
        *,
        kind: str,
        expect: list[str] | None,
        ref: str = "refs/heads/main",
        message: str = "chaos push",
    ) -> dict[str, Any]:
        """Send a signed push webhook for `sha` on `ref`."""
        body = json.dumps(
            {
                "ref": ref,
                "before": NULL_SHA,
                "after": sha,
                "commits": [
                    {"id": sha, "message": message, "added": [], "modified": ["README.md"], "removed": []}
                ],
                "head_commit": {"id": sha, "message": message},
                "repository": {"full_name": f"chaos/{repo}"},
            }
        ).encode()
        return self._send(repo, {"X-Gitea-Event": "push"}, body, kind=kind, expect=expect)

    def _send(
        self,
        source: str,
        headers: dict[str, str],
        body: bytes,
        *,
        kind: str,
        expect: list[str] | None,
        delivery_id: str | None = None,
    ) -> dict[str, Any]:
        delivery_id = delivery_id or str(uuid.uuid4())
        signed = {
            **headers,
            "X-Gitea-Delivery": delivery_id,
            SIGNATURE_HEADER: hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest(),
            "Content-Type": "application/json",
        }
        record: dict[str, Any] = {
            "source": source,
            "delivery_id": delivery_id,
            "kind": kind,
            "expect": expect,
        }
        tries = self.cluster.live_coordinators()[:2]
        began = time.monotonic()
        for server in tries:
            record["via"] = server.name
            try:
                answer = self._http.post(
                    f"{server.url}/webhooks/{self.sources[source]}", content=body, headers=signed
                )
            except httpx.HTTPError as exc:
                record["status"], record["error"] = None, type(exc).__name__
                continue
            record["status"] = answer.status_code
            if answer.status_code in (200, 202):
                data = answer.json()
                record["answer"] = data.get("status")
                record["delivery"] = data.get("delivery")
                break
            record["error"] = answer.text[:200]
            if answer.status_code < 500:
                break
        record["ms"] = round((time.monotonic() - began) * 1000)
        with self._lock:
            self.sent += 1
            if record.get("answer") == "accepted":
                if kind != "resend":
                    self.acked.append(
                        {"source": source, "headers": headers, "body": body, "delivery_id": delivery_id}
                    )
                    del self.acked[:-500]
                if kind in ("main", "setup"):
                    self.main_deliveries.append((source, record["delivery"]))
        self.recorder.webhook(record)
        return record

    # Cancels and operator events ---------------------------------------------------------------------------

    def _cancels(self) -> None:
        while not self._stop.wait(self.rng.uniform(2.0, 6.0)):
            with self._lock:
                recent = self.main_deliveries[-20:]
                choice = self.rng.choice(recent) if recent else None
            if choice is None:
                continue
            try:
                runs = self.cluster.admin("GET", f"/deliveries/{choice[1]}").json().get("runs") or []
                for run_id in runs:
                    answer = self.cluster.admin("POST", f"/runs/{run_id}/cancel", {"reason": "chaos"})
                    self.recorder.record("cancel", run_id=run_id, status=answer.status_code)
            except Exception as exc:
                self.recorder.note("cancel-error", error=repr(exc))

    def _emits(self) -> None:
        while not self._stop.wait(self.rng.uniform(10.0, 30.0)):
            repo = self.rng.choice(REPOS)
            try:
                answer = self.cluster.admin(
                    "POST",
                    "/events",
                    {"name": "chaos.ping", "payload": {"at": time.time()}, "routing_key": f"git:{repo}"},
                )
                self.recorder.record(
                    "emit",
                    routing_key=f"git:{repo}",
                    status=answer.status_code,
                    event=answer.json().get("id"),
                )
            except Exception as exc:
                self.recorder.note("emit-error", error=repr(exc))

    # The end --------------------------------------------------------------------------------------------

    def retire_cron(self) -> None:
        """Push a commit to main that removes the cron workflow from each repository, so no run starts after
        the load ends (the registration sync of a default-branch push drops its schedule)."""
        for name in REPOS:
            repo = self.work / "repos" / name
            write_workflows(repo, self._workflows(name, with_tick=False))
            sha = commit_all(repo, "retire the cron workflow")
            self.push(name, sha, kind="retire", expect=["ci"])
