"""`worker_knob`: a worker's spawns read fleet knobs from the applied settings snapshot
(docs/design/cluster.md §5.3)."""

from types import SimpleNamespace

from conveyor.cluster.snapshot import WORKER_SNAPSHOT_KNOBS, WorkerSettingsSnapshot
from conveyor.cluster.worker import worker_knob
from conveyor.model.knobs import CLUSTER_KNOBS_BY_NAME


def local_settings(**overrides: int) -> SimpleNamespace:
    """A worker's configuration: env/YAML defaults by knob name."""
    return SimpleNamespace(knob_default=lambda knob: overrides.get(knob.name))


def snapshot() -> WorkerSettingsSnapshot:
    return WorkerSettingsSnapshot(
        {name: int(CLUSTER_KNOBS_BY_NAME[name].default or 0) for name in WORKER_SNAPSHOT_KNOBS}
    )


async def test_a_pulled_snapshot_applies_at_the_next_read_without_a_restart() -> None:
    applied = snapshot()
    knob = worker_knob(local_settings(agent_token_ttl_ms=600_000), applied)
    before = await knob("agent_token_ttl_ms", None)
    applied.apply(7, {"agent_token_ttl_ms": 120_000})
    assert before == CLUSTER_KNOBS_BY_NAME["agent_token_ttl_ms"].default
    assert await knob("agent_token_ttl_ms", None) == 120_000


async def test_a_knob_outside_the_snapshot_comes_from_the_worker_s_own_configuration() -> None:
    knob = worker_knob(local_settings(dispatch_ack_timeout_ms=4_000), snapshot())
    assert "dispatch_ack_timeout_ms" not in WORKER_SNAPSHOT_KNOBS
    assert await knob("dispatch_ack_timeout_ms", None) == 4_000
