"""The chaos harness in the suite (docs/chaos.md): a 60-second run with a fixed seed, followed on the same
cluster by the first seconds of each seed of the replay list (chaos/replay.py), ending with zero
violations."""

from __future__ import annotations

import io
import sys

import pytest

from chaos.load import Mix
from chaos.replay import REPLAYS, SUITE_DURATION_S, SUITE_REPLAY_S, SUITE_SEED
from chaos.run import Options, run

pytestmark = [
    pytest.mark.slow,
    pytest.mark.xdist_group("chaos"),
    pytest.mark.timeout(900),
    pytest.mark.skipif(sys.platform != "linux", reason="the harness needs Linux"),
]

# Gentler than a long run's 20 webhooks/s: the suite shares the machine with its other tests.
SUITE_RATE = 6.0


def test_the_suite_seed_and_the_replayed_seeds_end_without_violations() -> None:
    report = io.StringIO()
    options = Options(
        duration_s=SUITE_DURATION_S,
        seed=SUITE_SEED,
        rate=SUITE_RATE,
        quiesce_s=300,
        mix=Mix(),
        replays=tuple((replay.seed, SUITE_REPLAY_S) for replay in REPLAYS),
    )
    outcome = run(options, out=report)
    assert sum(outcome.faults.values()) > 0 and outcome.acknowledged > 0, report.getvalue()
    assert outcome.violations == [], report.getvalue()
