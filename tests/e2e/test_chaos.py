"""The chaos harness in the suite (docs/chaos.md): a 60-second run with a fixed seed, and the replay list of
seeds that found bugs (chaos/replay.py), each ending with zero violations."""

from __future__ import annotations

import io
import sys

import pytest

from chaos.load import Mix
from chaos.replay import REPLAYS, SUITE_SEED, Replay
from chaos.run import Options, run

pytestmark = [
    pytest.mark.slow,
    pytest.mark.xdist_group("chaos"),
    pytest.mark.timeout(900),
    pytest.mark.skipif(sys.platform != "linux", reason="the harness needs Linux"),
]

# Gentler than a long run's 20 webhooks/s: the suite shares the machine with its other tests.
SUITE_RATE = 10.0


def chaos_run(seed: int, duration_s: float) -> None:
    report = io.StringIO()
    outcome = run(
        Options(duration_s=duration_s, seed=seed, rate=SUITE_RATE, quiesce_s=300, mix=Mix()), out=report
    )
    assert sum(outcome.faults.values()) > 0 and outcome.acknowledged > 0, report.getvalue()
    assert outcome.violations == [], report.getvalue()


def test_a_sixty_second_run_with_the_suite_seed_ends_without_violations() -> None:
    chaos_run(SUITE_SEED, 60)


@pytest.mark.parametrize("replay", REPLAYS, ids=[f"seed-{r.seed}" for r in REPLAYS])
def test_a_seed_that_found_a_bug_now_ends_without_violations(replay: Replay) -> None:
    chaos_run(replay.seed, replay.duration_s)
