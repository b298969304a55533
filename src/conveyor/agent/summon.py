"""The agent's side of `ctx.summon` (docs/design/execution.md §8.6): start the run with the job's credential and,
when the step waits, poll it until it ends. The orchestrator's rows are the truth, so a refused connection or a
5xx (a restart) is retried with the same `request_id` until the step's timeout."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import httpx

from conveyor.agent.transfer import tls_context
from conveyor.errors import ConveyorError
from conveyor.model.states import RUN_TERMINAL

POLL_S = 1.0
BACKOFF_MAX_S = 5.0


class SummonFailed(ConveyorError):
    """What the step's `SummonError` carries: the API code and its sentence (and the run, once started)."""

    def __init__(self, code: str, detail: str, run_id: str | None = None) -> None:
        super().__init__(f"{code}: {detail}")
        self.code = code
        self.detail = detail
        self.run_id = run_id

    def as_error(self) -> dict[str, Any]:
        """The `error` of the step's answer."""
        return {"code": self.code, "detail": self.detail, "run_id": self.run_id}


class _Unavailable(ConveyorError):
    """The orchestrator could not answer now (refused, timed out, 5xx): try again."""


def _refusal(response: httpx.Response) -> SummonFailed:
    try:
        body = response.json()
        return SummonFailed(str(body.get("error") or response.status_code), str(body.get("detail") or ""))
    except ValueError:
        return SummonFailed(str(response.status_code), response.text[:300])


class SummonClient:
    """One step's summon: `start`, then `wait` for the run's end."""

    def __init__(
        self,
        base_url: str,
        token: str,
        job_id: str,
        *,
        client: Callable[[], httpx.AsyncClient] | None = None,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.job_id = job_id
        self._base_url = base_url
        self._headers = {"Authorization": f"Bearer {token}"}
        self._client = client or self._default_client
        self._sleep = sleep
        self._clock = clock

    def _default_client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            base_url=self._base_url, headers=self._headers, timeout=httpx.Timeout(30.0), verify=tls_context()
        )

    async def handle(self, request: Mapping[str, Any]) -> dict[str, Any]:
        """Carry out a step's `summon.request`; `SummonFailed` for a refusal or a run that did not end in time."""
        async with self._client() as client:
            return await self._handle(client, request)

    async def _handle(self, client: httpx.AsyncClient, request: Mapping[str, Any]) -> dict[str, Any]:
        deadline = self._clock() + float(request.get("timeout_s") or 3600)
        body = {
            "request_id": str(request["request_id"]),
            "workflow": str(request["workflow"]),
            "inputs": dict(request.get("inputs") or {}),
            "repo": request.get("repo"),
        }
        started = await self._retried(
            deadline, None, lambda: client.post(f"/api/v1/jobs/{self.job_id}/summons", json=body)
        )
        if not request.get("wait", True) or started["status"] in RUN_TERMINAL:
            return {**started, "reason": started.get("reason"), "outputs": started.get("outputs") or {}}
        run_id = str(started["run_id"])
        path = f"/api/v1/jobs/{self.job_id}/summons/{run_id}"
        while True:
            current = await self._retried(deadline, run_id, lambda: client.get(path))
            if current["status"] in RUN_TERMINAL:
                return current
            if self._clock() + POLL_S > deadline:
                raise SummonFailed(
                    "timeout", f"run {run_id} is still {current['status']} at the summon's timeout", run_id
                )
            await self._sleep(POLL_S)

    async def _retried(
        self,
        deadline: float,
        run_id: str | None,
        call: Callable[[], Awaitable[httpx.Response]],
    ) -> dict[str, Any]:
        pause = 0.5
        while True:
            try:
                return await self._once(call)
            except _Unavailable as error:
                if self._clock() + pause > deadline:
                    raise SummonFailed(
                        "unavailable", f"the orchestrator did not answer: {error}", run_id
                    ) from None
                await self._sleep(pause)
                pause = min(pause * 2, BACKOFF_MAX_S)
            except SummonFailed as refusal:
                refusal.run_id = refusal.run_id or run_id
                raise

    async def _once(self, call: Callable[[], Awaitable[httpx.Response]]) -> dict[str, Any]:
        try:
            response = await call()
        except httpx.TransportError as error:
            raise _Unavailable(type(error).__name__) from None
        if response.status_code >= 500 or response.status_code == 429:
            raise _Unavailable(f"HTTP {response.status_code}")
        if response.status_code >= 400:
            raise _refusal(response)
        answer: dict[str, Any] = response.json()
        return answer
