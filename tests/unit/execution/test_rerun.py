"""Which jobs a re-run copies from its parent (docs/design/execution.md §8.5)."""

from conveyor.execution.rerun import copied_jobs

PARENT = [
    {"name": "build", "matrix_key": "", "status": "success", "outputs": {"compile": {"artifact": "a.whl"}}},
    {"name": "test", "matrix_key": "py=3.11", "status": "success", "outputs": None},
    {"name": "test", "matrix_key": "py=3.12", "status": "failed", "outputs": None},
    {"name": "lint", "matrix_key": "", "status": "skipped", "outputs": None},
    {"name": "docs", "matrix_key": "", "status": "cancelled", "outputs": None},
    {"name": "e2e", "matrix_key": "", "status": "timed_out", "outputs": None},
]


def test_a_full_rerun_copies_nothing() -> None:
    assert copied_jobs(PARENT, failed_only=False) is None


def test_failed_only_copies_exactly_the_successful_jobs_with_their_outputs() -> None:
    assert copied_jobs(PARENT, failed_only=True) == {
        ("build", ""): {"compile": {"artifact": "a.whl"}},
        ("test", "py=3.11"): None,
    }


def test_failed_only_of_a_run_without_successes_copies_nothing() -> None:
    assert copied_jobs([j for j in PARENT if j["status"] != "success"], failed_only=True) == {}
