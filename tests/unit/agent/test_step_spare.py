"""Which spare step process may run a step: same interpreter, same start-up environment."""

from __future__ import annotations

import pytest

from conveyor.agent.step_spare import spare_fits, startup_environment


def test_startup_environment_keeps_only_what_a_process_reads_when_it_starts() -> None:
    env = {"PATH": "/bin", "PYTHONPATH": "/x", "pythonhome": "/h", "LD_PRELOAD": "a.so", "CI": "true"}
    assert startup_environment(env) == {"PYTHONPATH": "/x", "pythonhome": "/h", "LD_PRELOAD": "a.so"}


@pytest.mark.parametrize(
    ("spare", "wanted", "fits"),
    [
        ({"PATH": "/a"}, {"PATH": "/b", "SECRET_FREE": "1"}, True),
        ({"PYTHONPATH": "/x"}, {"PYTHONPATH": "/x", "CONVEYOR_JOB_ID": "j"}, True),
        ({}, {"PYTHONDONTWRITEBYTECODE": "1"}, False),
        ({"PYTHONPATH": "/x"}, {"PYTHONPATH": "/y"}, False),
        ({"PYTHONPATH": "/x"}, {}, False),
        ({}, {"LD_LIBRARY_PATH": "/lib"}, False),
    ],
)
def test_a_spare_fits_when_the_start_up_environment_is_the_same(
    spare: dict[str, str], wanted: dict[str, str], fits: bool
) -> None:
    assert spare_fits("/usr/bin/python3", spare, "/usr/bin/python3", wanted) is fits


def test_a_spare_of_another_interpreter_never_fits() -> None:
    assert not spare_fits("/usr/bin/python3", {}, "/venv/bin/python", {})
