"""`conveyor admin run logs` reads a job's log by offsets; when the job runs again, the log shown becomes
the new execution's (docs/design/execution.md §9) and the reader starts over from 0."""

from __future__ import annotations

from typing import Any

import pytest

from conveyor.cli.admin import runs


class RecordedRangeRoute:
    """Answers the range route from a script of (execution, whole log, complete) states, one per read."""

    def __init__(self, states: list[tuple[str, str, bool]]) -> None:
        self.states = states
        self.reads: list[int] = []

    def get(self, path: str, **params: Any) -> dict[str, Any]:
        execution, log, complete = self.states[min(len(self.reads), len(self.states) - 1)]
        offset = int(params["offset"])
        self.reads.append(offset)
        text = log[offset:]
        return {"text": text, "next_offset": offset + len(text), "complete": complete, "execution": execution}


class NoWaits:
    def check(self, jobs: object = None) -> None:
        pass


def test_a_log_that_switches_to_a_new_execution_is_read_again_from_its_start(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runs, "LOG_POLL_S", 0)
    route = RecordedRangeRoute(
        [
            ("1.0", "first 0\nfirst 1\n", False),
            ("2.0", "second 0\nsecond 1\nsecond 2\n", False),
            ("2.0", "second 0\nsecond 1\nsecond 2\n", True),
        ]
    )
    runs._print_job_log(route, "r1", "j1", NoWaits())  # type: ignore[arg-type]
    printed = capsys.readouterr().out
    assert printed == (
        "first 0\nfirst 1\n"
        "--- the job ran again (execution 2.0): its log from the start ---\n"
        "second 0\nsecond 1\nsecond 2\n"
    )
    assert route.reads[:3] == [0, 16, 0]


def test_an_older_server_without_executions_is_read_by_offsets_alone(
    capsys: pytest.CaptureFixture[str],
) -> None:
    class OlderServer(RecordedRangeRoute):
        def get(self, path: str, **params: Any) -> dict[str, Any]:
            answer = super().get(path, **params)
            del answer["execution"]
            return answer

    runs._print_job_log(OlderServer([("", "a\nb\n", True)]), "r1", "j1", None)  # type: ignore[arg-type]
    assert capsys.readouterr().out == "a\nb\n"
