"""The artifact CLI's pure parts: sizes, the ETag's digest, the saved file's name, and `run show`'s test
report lines (docs/design/artifacts.md §7)."""

from __future__ import annotations

from pathlib import Path

import pytest

from conveyor.cli.admin.artifacts import destination, expected_digest, served_filename
from conveyor.cli.admin.runs import report_lines
from conveyor.model.sizes import size_text

DIGEST = "ab" * 32


@pytest.mark.parametrize(
    ("size", "shown"),
    [(0, "0 B"), (1023, "1023 B"), (1536, "1.5 KiB"), (3_000_000, "2.9 MiB"), (5 * 1024**4, "5120.0 GiB")],
)
def test_size_text(size: int, shown: str) -> None:
    assert size_text(size) == shown


@pytest.mark.parametrize(
    ("etag", "digest"),
    [
        (f'"{DIGEST}"', DIGEST),
        (f'W/"{DIGEST.upper()}"', DIGEST),
        (None, None),
        ('"not-a-digest"', None),
        (f'"{DIGEST[:-1]}"', None),
    ],
)
def test_expected_digest_reads_only_a_quoted_sha256(etag: str | None, digest: str | None) -> None:
    assert expected_digest(etag) == digest


@pytest.mark.parametrize(
    ("header", "saved"),
    [
        ("attachment; filename*=UTF-8''report%20final.xml", "report final.xml"),
        ('attachment; filename="plain.txt"', "plain.txt"),
        ("attachment; filename*=UTF-8''..%2F..%2Fetc%2Fpasswd", "passwd"),
        ("attachment; filename*=UTF-8''a%5C..%5Cwin.ini", "win.ini"),
        ("attachment; filename*=UTF-8''..", "dist"),
        ("attachment; filename*=UTF-8''%2F", "dist"),
        ("attachment", "dist"),
        (None, "dist"),
    ],
)
def test_the_served_name_never_leaves_the_directory(header: str | None, saved: str) -> None:
    assert served_filename(header, "dist") == saved


def test_destination_is_the_served_name_here_in_a_directory_or_the_path_given(tmp_path: Path) -> None:
    assert destination(None, "dist.tar") == Path("dist.tar")
    assert destination(str(tmp_path), "dist.tar") == tmp_path / "dist.tar"
    assert destination(str(tmp_path / "mine.tar"), "dist.tar") == tmp_path / "mine.tar"


def test_report_lines_give_counts_then_failing_tests_and_count_the_unnamed() -> None:
    reports = [
        {
            "artifact": "test-report",
            "job": "build",
            "passed": 10,
            "failed": 2,
            "skipped": 1,
            "errors": 1,
            "failures": [{"name": "t.a", "message": "boom"}, {"name": "t.b", "message": ""}],
        },
        {"artifact": "test-report-3.12", "job": None, "passed": 4, "failed": 0, "skipped": 0, "errors": 0},
    ]
    assert report_lines(reports) == [
        "  test-report (job build): 10 passed, 2 failed, 1 skipped, 1 errors",
        "    FAILED t.a: boom",
        "    FAILED t.b",
        "    … and 1 more failing",
        "  test-report-3.12: 4 passed, 0 failed, 0 skipped",
    ]
