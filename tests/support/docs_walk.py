"""Walking the docs' shell blocks as a new user types them: the README's first run and docs/cluster.md's
walkthrough, with only the placeholders a reader fills in (paths, ports, tokens, run ids) replaced.

A doc whose commands drift from what the CLI accepts or prints fails the walk.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
from collections.abc import Callable, Mapping
from pathlib import Path

import httpx

from tests.support.http import HTTP
from tests.support.waiting import wait_until

HEREDOC = re.compile(r"<<-?\s*'?\"?(\w+)'?\"?")


def sh_blocks(text: str, heading: str) -> list[str]:
    """The ```sh blocks of the section under `heading` (up to the next heading of the same level)."""
    level = heading.split(" ", 1)[0]
    section = text.split(heading + "\n", 1)[1]
    section = re.split(rf"^{re.escape(level)} ", section, maxsplit=1, flags=re.MULTILINE)[0]
    return re.findall(r"^```sh\n(.*?)^```", section, flags=re.MULTILINE | re.DOTALL)


def readme_first_run_block(root: Path) -> list[str]:
    """The shell lines of README.md's "A first run" block."""
    (block,) = sh_blocks((root / "README.md").read_text(encoding="utf-8"), "## A first run")[:1]
    return [line for line in block.splitlines() if line.strip()]


def fresh_shell_env(home: Path, *, strip: Path) -> dict[str, str]:
    """What a new terminal has: a PATH without the `strip` directory (a venv's bin), no CONVEYOR_* and no
    virtualenv, a git identity."""
    path = ":".join(
        p
        for p in os.environ.get("PATH", "/usr/bin:/bin").split(":")
        if p and Path(p).resolve() != strip.resolve()
    )
    # PYTHONPATH, when the test run sets one, only chooses which source tree the venv's `conveyor` runs.
    passthrough = {k: os.environ[k] for k in ("PYTHONPATH",) if k in os.environ}
    return {
        **passthrough,
        "PATH": path,
        "HOME": str(home),
        "LANG": "C.UTF-8",
        "GIT_AUTHOR_NAME": "New User",
        "GIT_AUTHOR_EMAIL": "new@example.com",
        "GIT_COMMITTER_NAME": "New User",
        "GIT_COMMITTER_EMAIL": "new@example.com",
        "GIT_CONFIG_NOSYSTEM": "1",
    }


def walk_readme_first_run(
    root: Path, *, server_url: str, token: str, workdir: Path, env: Mapping[str, str]
) -> None:
    """Type README's first-run block in a new terminal (`env`) against a running `conveyor up`: a new
    `master` repository in `workdir`, `conveyor` from `root`'s venv, the run followed to success."""
    lines = readme_first_run_block(root)
    assert lines[0].startswith("export PATH=") and "/path/to/conveyor/.venv/bin" in lines[0]
    assert any("<RUN>" in line for line in lines)
    # `conveyor` must not already be on the new terminal's PATH: the README's first line puts it there.
    which = subprocess.run(["bash", "-c", "command -v conveyor"], env=env, capture_output=True, text=True)
    assert which.returncode != 0, which.stdout
    repo = workdir / "my-repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", "-b", "master", str(repo)], check=True, env=env)
    (repo / "README.md").write_text("my project\n")
    filled = [
        line.replace("/path/to/conveyor", str(root))
        .replace("http://127.0.0.1:8470", server_url)
        .replace("cvy_admin_…", token)
        for line in lines
    ]
    # Everything up to the line that needs the run id, then that line with the id trigger-local printed.
    upto = next(i for i, line in enumerate(filled) if "<RUN>" in line)
    first = subprocess.run(
        ["bash", "-e", "-c", "\n".join(filled[:upto])],
        cwd=workdir,
        env=dict(env),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert first.returncode == 0, first.stdout + first.stderr
    started = re.findall(r"started run (\S+)", first.stdout)
    assert len(started) == 1, first.stdout
    assert "runs on pushes to master" in first.stdout
    last = subprocess.run(
        ["bash", "-e", "-c", "\n".join([filled[0], "cd my-repo", filled[upto].replace("<RUN>", started[0])])],
        cwd=workdir,
        env=dict(env),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert last.returncode == 0, last.stdout + last.stderr
    assert started[0] in last.stdout  # run list prints whole ids when not on a terminal
    assert last.stdout.rstrip().splitlines()[-1] == "run #1 ci succeeded"


def logical_commands(block: str) -> list[str]:
    """A block's commands as a shell reads them: `\\`-continued lines joined, a here-document kept with the
    line that opens it, comment-only and blank lines dropped."""
    commands: list[str] = []
    lines = block.splitlines()
    index = 0
    while index < len(lines):
        line = lines[index]
        index += 1
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        command = [line]
        while command[-1].endswith("\\") and index < len(lines):
            command.append(lines[index])
            index += 1
        opened = HEREDOC.search(command[-1])
        if opened:
            while index < len(lines):
                command.append(lines[index])
                index += 1
                if command[-1].strip() == opened.group(1):
                    break
        commands.append("\n".join(command))
    return commands


class Terminal:
    """One terminal of the walk: each command runs in bash with the directory and exported variables the
    previous ones left (as in an interactive shell), stdin closed, with a deadline."""

    def __init__(self, state_dir: Path, env: Mapping[str, str], cwd: Path) -> None:
        self.env = dict(env)
        self.exports = state_dir / "exports.sh"
        self.pwd = state_dir / "pwd"
        self.pwd.write_text(str(cwd))
        self.exports.write_text("")
        self.output = ""

    def run(self, command: str, *, timeout: float = 180) -> str:
        """Run one command; fail the test with its output unless it exits 0. Returns its output."""
        script = (
            f"source {shlex.quote(str(self.exports))}\n"
            f'cd "$(cat {shlex.quote(str(self.pwd))})"\n'
            f"{command}\n"
            "status=$?\n"
            f"export -p > {shlex.quote(str(self.exports))}\n"
            f"pwd > {shlex.quote(str(self.pwd))}\n"
            "exit $status\n"
        )
        done = subprocess.run(
            ["bash", "-c", script],
            env=self.env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        text = done.stdout + done.stderr
        self.output += f"$ {command}\n{text}"
        assert done.returncode == 0, f"`{command}` exited {done.returncode}:\n{text}"
        return text


class Background:
    """A block that runs a server, started as the doc says in a terminal of its own."""

    def __init__(
        self, block: str, *, env: Mapping[str, str], cwd: Path, log: Path, url: str | None = None
    ) -> None:
        self.log = log
        self._out = open(log, "w")
        self.proc = subprocess.Popen(
            ["bash", "-e", "-c", block],
            env=dict(env),
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=self._out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: stop() ends bash and the server together
        )
        ports = re.findall(r"--port (\d+)", block)
        assert url or ports, f"a server block names its port:\n{block}"
        self.url = url or f"http://127.0.0.1:{ports[-1]}"

    def output(self) -> str:
        """What the block printed so far."""
        self._out.flush()
        return self.log.read_text(errors="replace")

    def wait_until(self, check: Callable[[], bool], what: str, timeout: float = 120) -> None:
        """Until `check()` holds; fails at once, with the output, if the block ended."""

        def holds() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"the server block exited with {self.proc.returncode}:\n{self.output()}")
            return check()

        wait_until(holds, timeout=timeout, what=what)

    def health(self) -> str | None:
        """Its `/cluster/health` status (None while it does not answer)."""
        try:
            return str(HTTP.get(self.url + "/cluster/health", timeout=5).json().get("status"))
        except (httpx.HTTPError, ValueError):
            return None

    def stop(self, timeout: float = 30) -> None:
        """SIGTERM to the block's process group (Ctrl-C in its terminal), SIGKILL if it lingers."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=timeout)
        self._out.close()
