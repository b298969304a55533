"""JUnit XML reports summarised (docs/design/artifacts.md §5): counts and the failing tests' names.

Parsed with defusedxml: a report is whatever the job's tests wrote, and entities or a DTD in it are
refused rather than expanded."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from defusedxml import ElementTree

from conveyor.errors import ConveyorError

MAX_FAILURES = 50
MAX_MESSAGE = 500


class ReportUnreadable(ConveyorError, ValueError):
    """The file is not JUnit XML this parser can read."""


@dataclass
class Summary:
    """Counts over every test case, and the failing ones."""

    passed: int = 0
    failed: int = 0
    skipped: int = 0
    errors: int = 0
    failures: list[dict[str, str]] = field(default_factory=list)

    def add(self, other: Summary) -> None:
        """Fold another report's counts in."""
        self.passed += other.passed
        self.failed += other.failed
        self.skipped += other.skipped
        self.errors += other.errors
        self.failures.extend(other.failures[: MAX_FAILURES - len(self.failures)])


def summarise(path: Path) -> Summary:
    """The summary of one JUnit XML file (`<testsuites>` or a bare `<testsuite>`)."""
    try:
        root: Any = ElementTree.parse(str(path)).getroot()
    except Exception as error:  # defusedxml's refusals and ParseError alike
        raise ReportUnreadable(f"{path.name}: not readable JUnit XML ({error})") from None
    if root.tag not in ("testsuites", "testsuite"):
        raise ReportUnreadable(
            f"{path.name}: the root element is <{root.tag}>, not <testsuites> or <testsuite>"
        )
    summary = Summary()
    for case in root.iter("testcase"):
        name = ".".join(part for part in (case.get("classname"), case.get("name")) if part)
        problem = case.find("failure")
        kind = "failed"
        if problem is None:
            problem = case.find("error")
            kind = "errors"
        if problem is not None:
            setattr(summary, kind, getattr(summary, kind) + 1)
            if len(summary.failures) < MAX_FAILURES:
                message = (problem.get("message") or (problem.text or "")).strip().splitlines()
                summary.failures.append(
                    {"name": name[:MAX_MESSAGE], "message": (message[0] if message else "")[:MAX_MESSAGE]}
                )
        elif case.find("skipped") is not None:
            summary.skipped += 1
        else:
            summary.passed += 1
    return summary
