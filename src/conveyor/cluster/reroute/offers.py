"""Offers (docs/design/cluster.md §4.1, §4.2): sending `job.reroute` to the chosen worker, its ack or
its ack timeout, NAK backoff, the next hop, and handing a job back to local capacity.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

from conveyor.cluster import store
from conveyor.cluster.messages import (
    JobCancelRequest,
    JobReroute,
    JobRerouteAck,
    RerouteCheckout,
    RerouteLabels,
    SpawnRetry,
)
from conveyor.cluster.reroute.core import PendingOffer, RerouteCore, WorkerLink
from conveyor.cluster.reroute.policy import choose_worker
from conveyor.cluster.reroute.settings import RerouteSettings
from conveyor.db.tables import DEFAULT_ORG
from conveyor.execution.lifecycle import lock_job_for_change
from conveyor.execution.queue import agent_can_take, requeue
from conveyor.model.ids import new_id, utc_now
from conveyor.model.protocol import JobDispatch

log = logging.getLogger(__name__)

# `dispatch_history.reason` is a String(32).
HISTORY_REASON_MAX = 32


class OfferPart(RerouteCore):
    """The reroute service's offers: send, ack, NAK, ack timeout, onwards, back to local capacity."""

    async def offer(self, link: WorkerLink, dispatch: JobDispatch) -> bool:
        """Send `job.reroute` (hop 1) for a job the dispatcher claimed for `link`.

        The job goes to `choose_worker`'s pick (docs/design/cluster.md §4.1), which may be another worker than
        the one whose capacity claimed the row; its ack (or the ack timeout) decides what follows.
        """
        if self.peers.session_for(link.worker) is None:
            return False
        me = self.owner()
        # The job's row says which org's knobs apply (a dispatch's context names no org).
        async with self.db.read() as conn:
            org_id = await store.job_org(conn, dispatch.job_id) or DEFAULT_ORG
        settings = await self.settings(org_id)
        chosen = self._link_for(self.choose(_runs_on(dispatch), [me]), _runs_on(dispatch))
        if chosen is not None and chosen.worker != link.worker:
            async with self.db.transaction() as conn:
                await lock_job_for_change(conn, dispatch.job_id)
                now = await store.database_now(conn)
                moved = await store.move_claim(
                    conn,
                    job_id=dispatch.job_id,
                    attempt=dispatch.attempt,
                    from_agent=link.agent_id,
                    to_agent=chosen.agent_id,
                    owner=me,
                    now=now,
                    ack_deadline=now + timedelta(milliseconds=settings.ack_timeout_ms),
                    # No offer ended: the claim only changes hands before the first one.
                    outcome=None,
                    detail=None,
                )
            if moved:
                sent = await self._send_offer(
                    chosen, dispatch, hop=1, tried=[me], settings=settings, org_id=org_id
                )
                if not sent:
                    # The dispatcher gives back only its own link's claim: this one is ours to give back.
                    await self._give_back_unsent(dispatch, chosen)
                return True
        async with self.db.transaction() as conn:
            now = await store.database_now(conn)
            await store.extend_offer_deadline(
                conn,
                job_id=dispatch.job_id,
                claimed_by=link.agent_id,
                attempt=dispatch.attempt,
                ack_deadline=now + timedelta(milliseconds=settings.ack_timeout_ms),
            )
        return await self._send_offer(link, dispatch, hop=1, tried=[me], settings=settings, org_id=org_id)

    async def _give_back_unsent(self, dispatch: JobDispatch, link: WorkerLink) -> None:
        """An offer that never left (the session ended): the row goes back to `pending` as it was."""
        async with self.db.transaction() as conn:
            effects = await requeue(
                conn,
                dispatch.job_id,
                outcome="agent_lost",
                detail=f"worker {link.worker}: send failed",
                now=utc_now(),
                max_attempts=self.max_attempts,
                agent_id=link.agent_id,
                attempt=dispatch.attempt,
            )
        if effects and self.on_effects is not None:
            await self.on_effects(effects)
        self.dispatcher.wake()

    def choose(self, runs_on: Mapping[str, Any], tried: Sequence[str]) -> str | None:
        """`choose_worker` over what this coordinator knows now (heartbeats, backoff, offers in flight)."""
        in_flight: dict[str, int] = {}
        for link in self.links.values():
            in_flight[link.worker] = in_flight.get(link.worker, 0) + link.in_flight
        return choose_worker(
            runs_on,
            self.workers.values(),
            tried=tried,
            backing_off=self.backoff.backing_off(self.clock()),
            in_flight=in_flight,
        )

    def _link_for(self, worker: str | None, runs_on: Mapping[str, Any]) -> WorkerLink | None:
        """The worker's capacity unit that takes the job: a free matching agent first, then a scaler's."""
        if worker is None:
            return None
        fitting = [
            link
            for link in self.links.values()
            if link.worker == worker
            and (slot := link.free_slot()) is not None
            and agent_can_take(dict(runs_on), slot)
        ]
        fitting.sort(key=lambda link: ("/agent/" not in link.unit.key, link.unit.key))
        return fitting[0] if fitting else None

    async def _send_offer(
        self,
        link: WorkerLink,
        dispatch: JobDispatch,
        *,
        hop: int,
        tried: list[str],
        settings: RerouteSettings,
        org_id: str,
    ) -> bool:
        """Send one offer and arm its ack timer; False when the worker's session is gone."""
        session = self.peers.session_for(link.worker)
        if session is None:
            return False
        me = self.owner()
        message = JobReroute(
            message_id=dispatch.id,
            job_id=dispatch.job_id,
            run_id=dispatch.run_id,
            org_id=org_id,
            # The offering coordinator (the claim's owner): progress goes to it first.
            coordinator_id=me,
            hop=hop,
            max_hops=settings.max_hops,
            tried=tried,
            labels=RerouteLabels(runs_on=_runs_on(dispatch)),
            job=dispatch.job,
            workflow=dispatch.workflow.model_dump(mode="json"),
            attempt=dispatch.attempt,
            env=dispatch.env,
            upstream=dispatch.upstream,
            context=dispatch.context,
            log_max_bytes=dispatch.log_max_bytes,
            checkout=RerouteCheckout(
                repo_url=dispatch.repo.clone_url,
                ref=dispatch.repo.ref,
                sha=dispatch.repo.sha,
                auth_header=dispatch.repo.auth_header,
            ),
            secrets=dispatch.secrets,
            spawn_retry=SpawnRetry(
                max_attempts=settings.spawn_max_attempts, backoff_ms=settings.spawn_retry_backoff_ms
            ),
            # The claim's credential: every hop of this claim carries the same one, which the coordinators
            # check on the routes the worker proxies (docs/design/artifacts.md §4).
            job_token=dispatch.artifacts.token if dispatch.artifacts else None,
        )
        offer = PendingOffer(link, dispatch, hop, list(tried), settings, org_id)
        self.pending[dispatch.id] = offer
        link.in_flight += 1
        self.job_secrets[dispatch.job_id] = [
            *dispatch.secrets.values(),
            *([dispatch.repo.auth_header] if dispatch.repo.auth_header else []),
        ]
        try:
            await session.send(message)
        except Exception:
            self._forget_offer(dispatch.id)
            self.job_secrets.pop(dispatch.job_id, None)
            return False
        offer.timer = asyncio.create_task(
            self._ack_timer(dispatch.id, settings.ack_timeout_ms), name=f"reroute-ack-{dispatch.job_id}"
        )
        log.info(
            "offered job %s to worker %s (hop %d of %d)",
            dispatch.job_id,
            link.worker,
            hop,
            settings.max_hops,
            extra={"job_id": dispatch.job_id, "run_id": dispatch.run_id},
        )
        return True

    def _forget_offer(self, message_id: str) -> PendingOffer | None:
        offer = self.pending.pop(message_id, None)
        if offer is not None:
            offer.link.in_flight = max(0, offer.link.in_flight - 1)
            if offer.timer is not None and offer.timer is not asyncio.current_task():
                offer.timer.cancel()
        return offer

    async def _ack_timer(self, message_id: str, timeout_ms: int) -> None:
        await asyncio.sleep(timeout_ms / 1000)
        offer = self.pending.get(message_id)
        if offer is None:
            return
        self._forget_offer(message_id)
        self.metrics.offers.labels("ack-timeout").inc()
        self.metrics.redispatches.labels("ack-timeout").inc()
        log.warning("worker %s did not answer the offer of job %s in time", offer.link.worker, offer.job_id)
        # It may have accepted late: tell it to drop the job.
        await self._send(
            offer.link.worker,
            JobCancelRequest(run_id=offer.run_id, job_id=offer.job_id, reason="ack-timeout", force=True),
        )
        await self._refused(offer, "ack_timeout", "ack-timeout", f"worker {offer.link.worker}: ack-timeout")

    async def _refused(self, offer: PendingOffer, outcome: str, reason: str, detail: str) -> None:
        """A NAK or an ack timeout (docs/design/cluster.md §4.2): the worker backs off and the same job goes
        to the next candidate with `hop + 1`, or back to local capacity when hops or candidates ran out."""
        self.backoff.nak(offer.link.worker, self.clock())
        await self._route_onwards(
            offer.dispatch,
            from_agent=offer.link.agent_id,
            tried=[*offer.tried, offer.link.worker],
            hop=offer.hop + 1,
            settings=offer.settings,
            org_id=offer.org_id,
            outcome=outcome,
            reason=reason,
            detail=detail,
        )

    async def _route_onwards(
        self,
        dispatch: JobDispatch,
        *,
        from_agent: str,
        tried: list[str],
        hop: int,
        settings: RerouteSettings,
        org_id: str,
        outcome: str,
        reason: str,
        detail: str,
    ) -> None:
        """Offer a claimed job to the next candidate at `hop`, or hand its row back to local capacity.

        The offer that ended (at `hop - 1`) is recorded with `outcome`, `reason` and `detail`.
        """
        runs_on = _runs_on(dispatch)
        while hop <= settings.max_hops:
            link = self._link_for(self.choose(runs_on, tried), runs_on)
            if link is None:
                break
            async with self.db.transaction() as conn:
                await lock_job_for_change(conn, dispatch.job_id)
                now = await store.database_now(conn)
                moved = await store.move_claim(
                    conn,
                    job_id=dispatch.job_id,
                    attempt=dispatch.attempt,
                    from_agent=from_agent,
                    to_agent=link.agent_id,
                    owner=self.owner(),
                    now=now,
                    ack_deadline=now + timedelta(milliseconds=settings.ack_timeout_ms),
                    outcome=outcome,
                    detail=detail,
                    reason=reason,
                    ended_hop=hop - 1,
                )
            if not moved:
                # Cancelled, swept or finished meanwhile: nothing is left to route.
                self.job_secrets.pop(dispatch.job_id, None)
                return
            onward = dispatch.model_copy(update={"id": new_id()})
            if await self._send_offer(link, onward, hop=hop, tried=tried, settings=settings, org_id=org_id):
                return
            # Its session ended before the offer left: that worker counts as tried too.
            from_agent, tried, hop = link.agent_id, [*tried, link.worker], hop + 1
            outcome, reason, detail = "agent_lost", "session-gone", f"worker {link.worker}: session gone"
        await self._hand_back(
            dispatch.job_id,
            dispatch.run_id,
            dispatch.attempt,
            from_agent=from_agent,
            tried=tried,
            hop=hop - 1,
            outcome=outcome,
            reason=reason,
            detail=detail,
        )

    async def _hand_back(
        self,
        job_id: str,
        run_id: str,
        attempt: int,
        *,
        from_agent: str,
        tried: list[str],
        hop: int,
        outcome: str,
        reason: str,
        detail: str,
    ) -> None:
        """No hop or candidate left: the row goes back to `pending`, for coordinators' own agents and
        scalers only (`reroute_tried` set); the leader fails it `unroutable` after the grace."""
        self.job_secrets.pop(job_id, None)
        workers = ", ".join(tried[1:]) or "none"
        async with self.db.transaction() as conn:
            effects = await requeue(
                conn,
                job_id,
                outcome=outcome,
                detail=f"{detail}; no worker left to offer it to (tried: {workers})",
                now=utc_now(),
                max_attempts=self.max_attempts,
                agent_id=from_agent,
                attempt=attempt,
                reason=reason,
                reroute_hop=hop,
            )
            if effects is not None:
                await store.hand_back_to_local(conn, job_id, tried=tried, hop=hop)
        if effects is not None:
            log.info(
                "job %s goes back to local capacity after hop %d (workers tried: %s)",
                job_id,
                hop,
                workers,
                extra={"job_id": job_id, "run_id": run_id},
            )
        if effects and self.on_effects is not None:
            await self.on_effects(effects)
        self.dispatcher.wake()

    def ack_arrived(self, sender: str, ack: JobRerouteAck) -> None:
        """An offer's ack was read: stop its timer now. The ack is applied later, in arrival order behind
        the session's other job-path messages, and a slow database write among those (a result waiting on a
        run's lock) must not make it look late: the job would go onwards while this worker runs it."""
        offer = self.pending.get(ack.message_id)
        if offer is None or offer.link.worker != sender or offer.job_id != ack.job_id:
            return
        if offer.timer is not None and offer.timer is not asyncio.current_task():
            offer.timer.cancel()
            offer.timer = None

    async def on_ack(self, sender: str, ack: JobRerouteAck) -> None:
        """A worker's answer to an offer: record the holder, or offer the job onwards."""
        offer = self.pending.get(ack.message_id)
        if offer is None or offer.link.worker != sender or offer.job_id != ack.job_id:
            log.info("ignored an unexpected job.reroute.ack from %s for job %s", sender, ack.job_id)
            if ack.accepted:
                # It accepted after its offer timed out (the job went onwards): it must not run the job,
                # whatever became of the ack timeout's own cancel (docs/design/cluster.md §4.2).
                await self._cancel_unless_holder(sender, ack.job_id)
            return
        if not ack.accepted:
            self._forget_offer(ack.message_id)
            self.metrics.offers.labels(ack.reason or "nak").inc()
            log.info("worker %s refused job %s: %s", sender, ack.job_id, ack.reason)
            # The reason is the worker's word: it is cut to fit `dispatch_history.reason`.
            reason = (ack.reason or "nak")[:HISTORY_REASON_MAX]
            await self._refused(offer, "rejected", reason, f"worker {sender}: {ack.reason or 'refused'}")
            return
        # The offer is forgotten only once the holder is recorded: a transaction the database ends is
        # retried with the same ack (the peer hub), which must still find its offer (its timer stopped).
        self.ack_arrived(sender, ack)
        async with self.db.transaction() as conn:
            now = await store.database_now(conn)
            held = await store.mark_rerouted(
                conn,
                job_id=offer.job_id,
                claimed_by=offer.link.agent_id,
                attempt=offer.attempt,
                worker=sender,
                hop=offer.hop,
                tried=offer.tried,
                spawn_max_attempts=offer.settings.spawn_max_attempts,
                spawn_retry_backoff_ms=offer.settings.spawn_retry_backoff_ms,
                window_expires_at=now + timedelta(milliseconds=offer.settings.spawn_window_ms),
            )
        self._forget_offer(ack.message_id)
        self.backoff.ack(sender)
        # The worker's next heartbeat counts this job; until then its room stays spoken for.
        offer.link.in_flight += 1
        self.metrics.offers.labels("accepted").inc()
        if held:
            self.arm_window(offer.job_id, sender, offer.settings.spawn_window_ms / 1000)
            self._cancel_loop.wake()  # a job cancelled while its offer waited is cancelled there at once
        else:
            # Given back or cancelled meanwhile: the worker must not run it.
            self.job_secrets.pop(offer.job_id, None)
            await self._send(
                sender,
                JobCancelRequest(run_id=offer.run_id, job_id=offer.job_id, reason="rerouted", force=True),
            )

    async def _cancel_unless_holder(self, worker: str, job_id: str) -> None:
        """`job.cancel` (taken back) to `worker` unless the job's row names it as the holder."""
        async with self.db.read() as conn:
            holder = await store.reroute_holder(conn, job_id)
        if holder is None or holder.rerouted_to == worker:
            return
        await self._send(
            worker, JobCancelRequest(run_id=holder.run_id, job_id=job_id, reason="rerouted", force=True)
        )


def _runs_on(dispatch: JobDispatch) -> dict[str, Any]:
    return dict(dispatch.job.get("runs_on") or {})
