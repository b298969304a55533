"""The `conveyor` CLI in this process (typer's CliRunner), its command tree built once.

`CliRunner.invoke(app)` rebuilds the whole click tree from the typer app on every call (about 0.5 s
of signature and annotation evaluation, more on a loaded machine); a test that pages through a
thousand events calls it 143 times. The tree is built once here and handed to the runner.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any
from unittest import mock

from typer.main import get_command
from typer.testing import CliRunner, Result

from conveyor.cli.main import app


@functools.cache
def _command() -> Any:
    return get_command(app)


def invoke(args: Sequence[str], *, env: dict[str, str], input_text: str | None = None) -> Result:
    """`conveyor ARGS` in this process with `env` set; the result carries exit code and output."""
    with mock.patch("typer.testing._get_command", lambda _app: _command()):
        return CliRunner().invoke(app, list(args), env=env, input=input_text)
