"""Each Conveyor-side benchmark runs in its quickest real mode and prints its figures.

Real measurements with small counts (a real server, real agents, the real databases), never a dry
run: every figure a script promises must come out as a number. The Buildbot peer is not run here
(only `make bench` installs and runs it).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import postgres

pytestmark = pytest.mark.slow

REPO_ROOT = Path(__file__).resolve().parents[3]

# script -> (extra arguments beyond --quick, figure-name fragments that must have a value)
SCRIPTS: dict[str, tuple[list[str], list[str]]] = {
    "events": (
        ["--events", "30", "--leases", "60", "--history", "500"],
        [
            "events sqlite: emit -> processed throughput",
            "events postgresql: emit -> processed throughput",
            "lease rate, 0 processed events",
            "lease rate, 500 processed events",
        ],
    ),
    "ingest": (
        ["--seconds", "1.5", "--clients", "4", "--latency-posts", "5"],
        [
            "ingest sqlite: webhooks/s",
            "ingest postgresql: webhooks/s",
            "accepted and processed per second",
            "raw durable single-row inserts/s",
            "accepted / raw insert rate",
            "one client POST -> 202 p50",
        ],
    ),
    "queue": (
        ["--jobs", "60", "--history", "500"],
        [
            "plain-SQL ceiling",
            "Conveyor claim_for+finish_job",
            "Conveyor / plain SQL",
            "rate at 500 finished rows",
            "spread",
            "queue sqlite",
        ],
    ),
    "latency": (
        ["--pushes", "2"],
        [
            "latency sqlite connected agent: webhook -> first step running p50",
            "latency postgresql connected agent: webhook -> first step running p50",
            "latency postgresql connected agent: p99",
            "shell command executing",
            "latency sqlite cold spawn: webhook -> first step running p50",
            "latency postgresql cold spawn: p99",
        ],
    ),
    "memory": (
        ["--agents", "20"],
        ["memory sqlite: orchestrator RSS idle", "memory postgresql: RSS with 20 idle agents", "per 1,000"],
    ),
    "cli": (
        ["--samples", "3"],
        [
            "cli baseline: python -c 'import typer' p50",
            "cli baseline: python -c 'import typer, httpx' p50",
            "cli: conveyor --help / import typer",
            "cli: conveyor admin run list / import typer, httpx",
        ],
    ),
    "dashboard": (
        ["--runs", "1200", "--samples", "2"],
        [
            "dashboard sqlite: runs page, first page: 1,200 / 500",
            "dashboard postgresql: runs page, deep page: 1,200 / 500",
            "filtered by workflow",
            "dashboard sqlite: run page, a four-job diamond: 1,200 / 500",
        ],
    ),
    "container_start": (
        ["--samples", "3"],
        [
            "container_start baseline: host process start to exit p50",
            "container_start: create + start to exit, host network, p50",
            "container_start: container - host process",
            "container_start: remove p50",
        ],
    ),
    "container_job": (
        ["--samples", "1"],
        [
            "container_job baseline: first step on the host p50",
            "container_job: first step, container, host network p50",
            "container_job: container, host network - host",
            "container_job: first step, container, bridge p50",
            "container_job: service start to healthy p50",
        ],
    ),
    "artifacts": (
        ["--size-mb", "4"],
        [
            "artifacts filesystem: baseline cp",
            "artifacts filesystem: upload / cp",
            "artifacts filesystem: download / cp",
            "artifacts s3: baseline raw PUT",
            "artifacts s3: upload / raw PUT",
            "artifacts s3: download / raw GET",
            "the store's S3 calls alone",
            "ceiling, one SHA-256 pass / cp",
            "upload / one SHA-256 pass",
            "upload / the store's S3 calls alone",
        ],
    ),
    "caches": (
        [],
        [
            "caches: install step, cold (miss: venv + pip install + save)",
            "caches: install step, warm (exact hit: restore)",
            "caches: install step, cold / warm",
            "caches: baseline tar --zstd -xf, local file",
            "caches: Conveyor restore (lookup, download, digest, extract)",
            "caches: restore / tar -x",
            "caches: restore from the agent's own store / tar -x",
            "caches: extraction alone (restore_archive, local file)",
        ],
    ),
    "matching": (
        ["--samples", "3"],
        [
            "(events router, custom event, 10 subscribers) p99 at 10,000",
            "(events router, workflow_complete, by workflow name) p99 at 10,000",
            "(push matcher, indexed) p99 at 10,000",
            "(push matcher, reference (baseline, same run)) p99 at 10,000",
            "growth per 10x",
        ],
    ),
}


@pytest.mark.timeout(600)
@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_a_benchmark_prints_its_figures(script: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    postgres.check_reachable()
    extra, expected = SCRIPTS[script]
    if script in ("container_start", "container_job"):  # the test run's engine, with its images
        extra = [*extra, "--docker-host", request.getfixturevalue("docker_engine").host]
    out = tmp_path / "figures.json"
    done = subprocess.run(
        [sys.executable, "-m", f"bench.{script}", "--quick", "--json", str(out), *extra],
        cwd=REPO_ROOT,
        env={**_environ(), "CONVEYOR_BENCH_POSTGRES_URL": postgres.server_url()},
        capture_output=True,
        text=True,
        timeout=540,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert f"== {script}" in done.stdout
    figures = json.loads(out.read_text())["figures"]
    for fragment in expected:
        matching = [f for f in figures if fragment in f["name"]]
        assert matching, f"no figure named like {fragment!r} in {[f['name'] for f in figures]}"
        for figure in matching:
            assert isinstance(figure["value"], int | float) and math.isfinite(figure["value"]), figure
            # A difference ("container - host") is signed: one noisy sample can put the host's side above.
            if " - " not in figure["name"]:
                assert figure["value"] >= 0, figure
            assert figure["name"] in done.stdout  # printed in the table too


def test_the_table_marks_a_missed_target_and_an_unmeasured_figure() -> None:
    from bench.harness import Figure, format_table, percentile

    table = format_table(
        [
            Figure("fast enough", 40.0, "ms", "<= 100 ms", True),
            Figure("too slow", 1234.5, "ms", "<= 100 ms", False),
            Figure("not here", None, "ms", note="n/a (reason)"),
        ]
    )
    lines = table.splitlines()
    assert lines[2].split()[-1] == "yes"
    assert "1,234" in lines[3] and lines[3].rstrip().endswith("NO")
    assert "n/a" in lines[4] and "n/a (reason)" in lines[4]
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile([5], 99) == 5
    assert percentile(list(range(101)), 99) == 99


def _environ() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if not k.upper().startswith("CONVEYOR_")}
