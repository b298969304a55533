"""Seeds that found bugs, replayed by the suite (tests/e2e/test_chaos.py) so each stays fixed.

Each entry names the bug and the focused regression test that guards its cause; the replay is the second
line of defence. The suite's whole budget is about 20 minutes, so it replays the first `SUITE_REPLAY_S`
seconds of each seed's schedule after its own `SUITE_DURATION_S` run, on the same cluster;
`python -m chaos --seed SEED --duration DURATION_S` replays the run that found the bug in full.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Replay:
    """A seed that found a bug, the duration of the run that found it, and what it found."""

    seed: int
    duration_s: float
    bug: str
    regression_test: str


SUITE_SEED = 44  # the seed of the suite's 60-second run
SUITE_DURATION_S = 60.0  # the suite's own run with SUITE_SEED (issue 44: a 60-second run in the slow tier)
SUITE_REPLAY_S = 10.0  # seconds of each replayed seed's schedule in the suite

REPLAYS: tuple[Replay, ...] = (
    Replay(
        seed=3,
        duration_s=40,
        bug="a worker's late job.reroute.ack was ignored after the ack timeout sent the job onwards: two "
        "workers ran the job",
        regression_test="tests/integration/cluster/test_reroute_service.py::"
        "test_an_acceptance_arriving_after_the_ack_timeout_is_told_to_drop_the_job",
    ),
    Replay(
        seed=7,
        duration_s=90,
        bug="a first reroute offer's queue row kept the dispatcher's 10 s ack deadline; the ack sweep took it "
        "back while the worker accepted within the 15 s reroute ack timeout, and the job ran on two nodes",
        regression_test="tests/integration/cluster/test_reroute_service.py::"
        "test_a_first_offer_gives_its_row_the_reroute_ack_deadline_not_the_agents_shorter_one",
    ),
    Replay(
        seed=4401,
        duration_s=1800,
        bug="pg_terminate_backend ended a worker's job.reroute.ack transaction; the peer hub dropped the ack, "
        "the row was requeued and an agent ran the job the worker was running",
        regression_test="tests/integration/cluster/test_reroute_service.py::"
        "test_an_ack_whose_transaction_the_database_ended_is_applied_by_its_retry",
    ),
    Replay(
        seed=5,
        duration_s=60,
        bug="pg_terminate_backend under an agent's job.ack closed the agent's connection (not transient); its "
        "started job was requeued and a second agent ran it",
        regression_test="tests/integration/db/test_pool_ping.py::"
        "test_a_transaction_on_a_terminated_session_fails_transient_so_callers_retry_it",
    ),
)
