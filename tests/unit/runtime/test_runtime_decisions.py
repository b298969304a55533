"""Pure runtime decisions: renewal deadline, boot judgement, instance id, the operator reports."""

from datetime import UTC, datetime, timedelta
from pathlib import Path

from conveyor.runtime.instances import Identity, judge_boot, load_instance_id, stale_window
from conveyor.runtime.lease import renewal_budget_ms, renewal_overdue
from conveyor.runtime.reports import PeerVersion, SelfReport, cluster_status, propagation_report
from conveyor.runtime.store import InstanceRow, LeaseRow

NOW = datetime(2025, 3, 1, 12, 0, 0, tzinfo=UTC)
WINDOW = timedelta(seconds=30)
ME = Identity("b-node", "boot-2", "coordinator", "http://b:8470", "1.0")


def row(
    instance_id: str, *, boot: str = "boot-1", age_s: float = 1, role: str = "coordinator", version: int = 0
) -> InstanceRow:
    return InstanceRow(
        instance_id=instance_id,
        boot_id=boot,
        role=role,
        advertise_url=None,
        software_version="1.0",
        started_at=NOW - timedelta(hours=1),
        last_heartbeat_at=NOW - timedelta(seconds=age_s),
        draining=False,
        applied_settings_version=version,
    )


def test_the_renewal_budget_is_ttl_minus_one_second_and_a_third_of_short_ttls() -> None:
    assert renewal_budget_ms(15_000) == 14_000
    assert renewal_budget_ms(1500) == 1000


def test_renewal_is_overdue_only_after_the_budget() -> None:
    assert not renewal_overdue(100.0, 113.9, 15_000)
    assert renewal_overdue(100.0, 114.1, 15_000)


def test_a_live_twin_with_another_boot_id_makes_boot_wait_with_duplicate_instance_id() -> None:
    verdict, reason = judge_boot([row("b-node")], me=ME, dialect="postgresql", now=NOW, window=WINDOW)
    assert verdict == "wait" and "duplicate instance_id b-node" in reason


def test_a_stale_twin_or_our_own_row_lets_boot_go() -> None:
    rows = [row("b-node", age_s=31), row("b-node", boot="boot-2")]
    assert judge_boot(rows, me=ME, dialect="postgresql", now=NOW, window=WINDOW)[0] == "go"


def test_other_live_coordinators_are_fine_on_postgresql() -> None:
    assert judge_boot([row("a-node")], me=ME, dialect="postgresql", now=NOW, window=WINDOW)[0] == "go"


def test_another_live_coordinator_on_sqlite_makes_boot_wait_with_the_postgresql_message() -> None:
    verdict, reason = judge_boot([row("a-node")], me=ME, dialect="sqlite", now=NOW, window=WINDOW)
    assert (verdict, reason) == ("wait", "SQLite supports one coordinator; use PostgreSQL")


def test_a_live_worker_row_does_not_block_a_sqlite_coordinator() -> None:
    assert judge_boot([row("w", role="worker")], me=ME, dialect="sqlite", now=NOW, window=WINDOW)[0] == "go"


def test_the_instance_id_is_generated_once_into_the_home(tmp_path: Path) -> None:
    first = load_instance_id(tmp_path / "home", None)
    assert (tmp_path / "home" / "instance-id").read_text().strip() == first
    assert load_instance_id(tmp_path / "home", None) == first
    assert load_instance_id(tmp_path / "home", "configured") == "configured"


def test_the_stale_window_is_interval_times_beats() -> None:
    assert stale_window(10_000, 3) == timedelta(seconds=30)


def test_propagation_lists_this_node_first_then_peers_with_their_status() -> None:
    me = SelfReport(
        "b-node", "coordinator", served_version=4, last_heartbeat_at=NOW - timedelta(milliseconds=150)
    )
    rows = [row("a-node", version=3), row("b-node", version=4), row("c-node", version=5, age_s=60)]
    report = propagation_report(current_version=4, me=me, rows=rows, now=NOW, window=WINDOW)
    assert report["current_version"] == 4 and report["reported_by"] == "b-node"
    assert report["generated_at"] == "2025-03-01T12:00:00.000Z"
    entries = report["orchestrators"]
    assert [e["instance_id"] for e in entries] == ["b-node", "a-node", "c-node"]
    assert entries[0] | {} == {
        "instance_id": "b-node",
        "role": "coordinator",
        "self": True,
        "connected": True,
        "applied_version": 4,
        "status": "in-sync",
        "last_heartbeat_at": "2025-03-01T11:59:59.850Z",
        "last_heartbeat_age_ms": 150,
    }
    assert (entries[1]["status"], entries[1]["connected"]) == ("behind", True)
    assert (entries[2]["status"], entries[2]["connected"], entries[2]["last_heartbeat_age_ms"]) == (
        "ahead",
        False,
        60_000,
    )


def test_a_node_that_never_beat_reports_null_heartbeat_fields() -> None:
    me = SelfReport("b-node", "coordinator", served_version=0, last_heartbeat_at=None)
    entry = propagation_report(current_version=0, me=me, rows=[], now=NOW, window=WINDOW)["orchestrators"][0]
    assert entry["last_heartbeat_at"] is None and entry["last_heartbeat_age_ms"] is None


def test_propagation_lists_registry_workers_after_the_rows_with_their_heartbeat_version() -> None:
    me = SelfReport("b-node", "coordinator", served_version=4, last_heartbeat_at=NOW)
    peers = [
        PeerVersion("a-node", "coordinator", True, 9, NOW, 10),  # has a row: the row's entry stands
        PeerVersion("w-ahead", "worker", True, 5, NOW - timedelta(milliseconds=200), 200),
        PeerVersion("w-behind", "worker", False, 3, NOW, 5000),
        PeerVersion("w-silent", "worker", False, 0, None, None),
    ]
    report = propagation_report(
        current_version=4, me=me, rows=[row("a-node", version=4)], now=NOW, window=WINDOW, peers=peers
    )
    entries = report["orchestrators"]
    assert [(e["instance_id"], e["applied_version"], e["status"]) for e in entries] == [
        ("b-node", 4, "in-sync"),
        ("a-node", 4, "in-sync"),
        ("w-ahead", 5, "ahead"),
        ("w-behind", 3, "behind"),
        ("w-silent", 0, "behind"),
    ]
    assert entries[2] | {} == {
        "instance_id": "w-ahead",
        "role": "worker",
        "self": False,
        "connected": True,
        "applied_version": 5,
        "status": "ahead",
        "last_heartbeat_at": "2025-03-01T11:59:59.800Z",
        "last_heartbeat_age_ms": 200,
    }
    assert entries[4]["last_heartbeat_at"] is None and entries[4]["last_heartbeat_age_ms"] is None


def test_cluster_status_names_the_live_lease_holder_as_leader() -> None:
    lease = LeaseRow(
        holder="a-node",
        epoch=7,
        acquired_at=NOW - timedelta(seconds=5),
        expires_at=NOW + timedelta(seconds=10),
    )
    status = cluster_status(
        me="b-node", rows=[row("a-node"), row("b-node", boot="boot-2")], lease=lease, now=NOW, window=WINDOW
    )
    assert status["leader"] == "a-node" and status["lease"]["epoch"] == 7 and status["lease"]["live"]
    assert [(i["instance_id"], i["leader"], i["self"]) for i in status["instances"]] == [
        ("a-node", True, False),
        ("b-node", False, True),
    ]
    assert status["instances"][0]["last_heartbeat_age_ms"] == 1000


def test_an_expired_lease_means_no_leader() -> None:
    lease = LeaseRow(
        holder="a-node",
        epoch=7,
        acquired_at=NOW - timedelta(seconds=30),
        expires_at=NOW - timedelta(seconds=1),
    )
    status = cluster_status(me="b-node", rows=[], lease=lease, now=NOW, window=WINDOW)
    assert status["leader"] is None and status["lease"]["live"] is False
    assert cluster_status(me="b-node", rows=[], lease=None, now=NOW, window=WINDOW)["lease"] is None
