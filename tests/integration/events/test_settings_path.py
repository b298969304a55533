"""The event system's settings come through the one settings path (YAML file < environment < flags), on
both databases: values of a `--config` file reach the router, and its leader tasks."""

from __future__ import annotations

from pathlib import Path

from conveyor.events.startup import EVENTS
from conveyor.runtime.boot import runtime_services
from tests.support.inprocess import in_process_server

YAML = """
events_lease_seconds: 7
events_retry_base_seconds: 0.25
events_retry_max_seconds: 9
events_poll_seconds: 0.4
events_scan_seconds: 0.6
events_cleanup_seconds: 120
events_concurrency: 3
events_max_chain_depth: 4
events_batch_max_runs: 20
cron_tick_seconds: 0.7
"""


async def test_event_settings_in_the_config_file_reach_the_router_and_its_leader_tasks(
    database_url: str, tmp_path: Path
) -> None:
    config = tmp_path / "conveyor.yaml"
    config.write_text(YAML)
    # The environment beats the file, as for every other setting.
    env = {"CONVEYOR_EVENTS_CONCURRENCY": "5"}
    async with in_process_server(database_url, tmp_path / "home", env=env, config_file=config) as server:
        settings = server.state.parts.need(EVENTS).settings
        assert (
            settings.lease_seconds,
            settings.retry_base_seconds,
            settings.retry_max_seconds,
            settings.poll_seconds,
            settings.scan_seconds,
            settings.cleanup_seconds,
            settings.concurrency,
            settings.max_chain_depth,
            settings.batch_max_runs,
            settings.cron_tick_seconds,
        ) == (7, 0.25, 9, 0.4, 0.6, 120, 5, 4, 20, 0.7)
        intervals = {
            task.name: task.interval_ms for task in runtime_services(server.state.parts).leadership.tasks
        }
        assert (intervals["event-scan"], intervals["event-cleanup"], intervals["cron"]) == (600, 120_000, 700)
