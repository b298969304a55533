"""A step's log as the run page shows it: numbered lines rendered from ANSI, their times, and the setup
step's git commands folded. Pure; `static/app.js` builds the same structure for streamed lines."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from markupsafe import Markup

from conveyor.dashboard.ansi import render_ansi

SYS_PREFIX = "[conveyor] "
GIT_COMMAND = SYS_PREFIX + "$ git "


@dataclass(frozen=True)
class LogLine:
    """One line: its number in the step's log (from 1), its HTML and its time (RFC 3339) if known."""

    number: int
    html: Markup
    time: str | None = None


@dataclass
class GitFold:
    """The setup step's git commands and their output, shown folded whatever the job's outcome."""

    lines: list[LogLine] = field(default_factory=list)


LogBlock = LogLine | GitFold


@dataclass(frozen=True)
class StepLogView:
    """What the page shows of one step's log: its blocks, and whether (and after how many bytes) it was
    cut short."""

    blocks: list[LogBlock]
    truncated: bool
    shown: int


def step_log_view(
    text: str, times: Sequence[str | None] | None, *, setup: bool, complete: bool
) -> StepLogView:
    """A step's log read in one window: `complete` is false when the window did not reach its end."""
    return StepLogView(log_blocks(text, times, setup=setup), not complete, len(text.encode("utf-8")))


def is_setup_step(step: dict[str, object]) -> bool:
    """The step the runner reports before the workflow's own: checkout, requirements, rules."""
    return step.get("kind") == "setup" or (step.get("step_index") == 0 and step.get("name") == "setup")


def log_blocks(
    text: str, times: Sequence[str | None] | None = None, *, setup: bool = False
) -> list[LogBlock]:
    """The lines of `text` (each ended by a newline, the last one maybe not) as numbered lines.

    In the setup step a `[conveyor] $ git …` line opens a fold (or continues the open one) and the
    lines that follow without the `[conveyor] ` prefix (git's own output) stay in it; the next other
    `[conveyor] ` line closes it, so a checkout's error stays visible beside the folded commands.
    """
    raw_lines = text.split("\n")
    if raw_lines and raw_lines[-1] == "":
        raw_lines.pop()
    blocks: list[LogBlock] = []
    for index, raw in enumerate(raw_lines):
        time = times[index] if times is not None and index < len(times) else None
        line = LogLine(index + 1, Markup(render_ansi(raw)), time)
        open_fold = blocks[-1] if blocks and isinstance(blocks[-1], GitFold) else None
        if setup and raw.startswith(GIT_COMMAND):
            if open_fold is None:
                open_fold = GitFold()
                blocks.append(open_fold)
            open_fold.lines.append(line)
        elif open_fold is not None and not raw.startswith(SYS_PREFIX):
            open_fold.lines.append(line)
        else:
            blocks.append(line)
    return blocks


def line_anchor(job_id: str, step_index: int, number: int) -> str:
    """The element id (and URL fragment) of a line: `log-<job id>-<step>-<number>`."""
    return f"log-{job_id}-{step_index}-{number}"
