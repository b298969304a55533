"""The Buildbot peer: change POST → first shell step running, Buildbot vs Conveyor in the same run.

Buildbot (`buildbot` and `buildbot-worker` from PyPI, pinned below) is installed into its own virtual
environment (bench/.venv-buildbot, reused when the version matches). A master is configured with the
`base` change hook (`POST /change_hook/base`, no poller), a SingleBranchScheduler without tree-stable
timer, and one local worker; the builder checks out the same kind of origin repository (file://) and
then runs a first shell step. Both systems are measured the same way: the first shell command
writes `date +%s.%N` into a marker file, and the latency is that timestamp minus the time right
before the POST (Buildbot stores step times in whole seconds, so its API cannot be used). Pushes are
sequential, each build finishing before the next change; the first of each is a warm-up.

Conveyor's side is bench/latency.py's connected-agent measurement on SQLite (Buildbot also runs on
SQLite here). The headline is `conveyor_p50 / buildbot_p50` (target ≤ 0.1).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from bench.harness import (
    REPO_ROOT,
    Report,
    arguments,
    finish,
    free_port,
    git,
    make_repo,
    new_commit,
    percentile,
    stop_process,
    wait_until,
    workdir,
)
from bench.latency import PUSH_GAP_S, measure_conveyor, wait_marker

BUILDBOT_VERSION = "4.3.0"
# The www package is needed by the change hook; Twisted is pinned too, so every run installs the same peer.
REQUIREMENTS = [
    f"buildbot=={BUILDBOT_VERSION}",
    f"buildbot-www=={BUILDBOT_VERSION}",
    f"buildbot-worker=={BUILDBOT_VERSION}",
    "twisted==26.10.0",
]
DEFAULT_VENV = REPO_ROOT / "bench" / ".venv-buildbot"
RATIO_TARGET = 0.1

MASTER_CFG = """
from buildbot.plugins import schedulers, steps, util, worker

c = BuildmasterConfig = {}
c["workers"] = [worker.Worker("bench-worker", "bench-pass")]
c["protocols"] = {"pb": {"port": "tcp:%(pb_port)d:interface=127.0.0.1"}}
c["change_source"] = []
c["schedulers"] = [
    schedulers.SingleBranchScheduler(
        name="on-main",
        change_filter=util.ChangeFilter(branch="main"),
        treeStableTimer=None,
        builderNames=["bench"],
    )
]
factory = util.BuildFactory()
factory.addStep(steps.Git(repourl=%(repourl)r, mode="incremental", branch="main", name="checkout"))
factory.addStep(steps.ShellCommand(command=["sh", "-c", "date +%%s.%%N >> %(marker)s"], name="first"))
c["builders"] = [util.BuilderConfig(name="bench", workernames=["bench-worker"], factory=factory)]
c["www"] = {"port": "tcp:%(www_port)d:interface=127.0.0.1", "change_hook_dialects": {"base": True}, "plugins": {}}
c["db"] = {"db_url": "sqlite:///state.sqlite"}
c["buildbotURL"] = "http://127.0.0.1:%(www_port)d/"
c["title"] = "conveyor-bench"
c["buildbotNetUsageData"] = None
"""


def install(venv: Path) -> Path:
    """The Buildbot venv (created and filled when missing or at another version); its bin dir."""
    stamp = venv / ".bench-requirements"
    wanted = "\n".join(REQUIREMENTS)
    if stamp.exists() and stamp.read_text() == wanted:
        return venv / "bin"
    print(f"installing {', '.join(REQUIREMENTS)} into {venv}", flush=True)
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
    subprocess.run(
        [
            str(venv / "bin" / "python"),
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            *REQUIREMENTS,
        ],
        check=True,
    )
    stamp.write_text(wanted)
    return venv / "bin"


def _log_tail(path: Path) -> str:
    return path.read_text(errors="replace")[-3000:] if path.exists() else "(no log)"


@contextmanager
def buildbot(bin_dir: Path, base: Path, origin: Path, marker: Path) -> Iterator[str]:
    """A running master and worker (foreground processes, stopped afterwards); yields the www URL."""
    master, worker_dir = base / "master", base / "worker"
    pb_port, www_port = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CONVEYOR_", "VIRTUAL_ENV"))}
    env["PATH"] = f"{bin_dir}:{env.get('PATH', '')}"
    subprocess.run([str(bin_dir / "buildbot"), "create-master", "-q", str(master)], check=True, env=env)
    (master / "master.cfg").write_text(
        MASTER_CFG
        % {"pb_port": pb_port, "www_port": www_port, "repourl": f"file://{origin}", "marker": marker}
    )
    subprocess.run(
        [
            str(bin_dir / "buildbot-worker"),
            "create-worker",
            "-q",
            str(worker_dir),
            f"127.0.0.1:{pb_port}",
            "bench-worker",
            "bench-pass",
        ],
        check=True,
        env=env,
    )
    master_log = open(base / "master.out", "ab")
    worker_log = open(base / "worker.out", "ab")
    master_proc = subprocess.Popen(
        [str(bin_dir / "buildbot"), "start", "--nodaemon", str(master)],
        env=env,
        stdout=master_log,
        stderr=subprocess.STDOUT,
    )
    worker_proc: subprocess.Popen[bytes] | None = None
    url = f"http://127.0.0.1:{www_port}"
    try:

        def master_up() -> bool:
            if master_proc.poll() is not None:
                raise RuntimeError(f"buildbot master exited:\n{_log_tail(master / 'twistd.log')}")
            return httpx.get(f"{url}/api/v2/builders", timeout=5).status_code == 200

        wait_until(master_up, timeout=120, what="the Buildbot master", poll=0.2)
        worker_proc = subprocess.Popen(
            [str(bin_dir / "buildbot-worker"), "start", "--nodaemon", str(worker_dir)],
            env=env,
            stdout=worker_log,
            stderr=subprocess.STDOUT,
        )

        def worker_connected() -> bool:
            if worker_proc is not None and worker_proc.poll() is not None:
                raise RuntimeError(f"buildbot worker exited:\n{_log_tail(worker_dir / 'twistd.log')}")
            workers = httpx.get(f"{url}/api/v2/workers", timeout=5).json()["workers"]
            return bool(workers and workers[0]["connected_to"])

        wait_until(worker_connected, timeout=120, what="the Buildbot worker to connect", poll=0.2)
        yield url
    finally:
        if worker_proc is not None:
            stop_process(worker_proc)
        stop_process(master_proc)
        master_log.close()
        worker_log.close()


def completed_builds(url: str) -> int:
    """Builds the master has finished."""
    return len(httpx.get(f"{url}/api/v2/builds", params={"complete": "true"}, timeout=10).json()["builds"])


def wait_builds(url: str, count: int) -> None:
    """Until the master finished `count` builds."""
    wait_until(lambda: completed_builds(url) >= count, timeout=120, what="the build to finish", poll=0.05)


def measure_buildbot(bin_dir: Path, base: Path, *, pushes: int) -> list[float]:
    """Sequential changes through the base change hook; ms to the first shell command."""
    origin = make_repo(base / "bb-origin", {"ci": "from conveyor import workflow\n"})
    marker = base / "bb-marker.txt"
    latencies: list[float] = []
    with buildbot(bin_dir, base, origin, marker) as url, httpx.Client(base_url=url, timeout=30) as http:
        for index in range(pushes + 1):
            sha = new_commit(origin, f"bench change {index}")
            started = time.time()
            answer = http.post(
                "/change_hook/base",
                data={
                    "author": "Bench <bench@example.com>",
                    "repository": f"file://{origin}",
                    "project": "",
                    "branch": "main",
                    "revision": sha,
                    "comments": f"bench change {index}",
                    "category": "",
                },
            )
            if answer.status_code != 200:
                raise RuntimeError(f"change hook answered {answer.status_code}: {answer.text}")
            shell_at = wait_marker(marker, index + 1, timeout=120)
            wait_builds(url, index + 1)
            time.sleep(PUSH_GAP_S)  # the same pause between pushes as Conveyor's side
            if index:
                latencies.append((shell_at - started) * 1000)
    _ = git  # same git helper family as the Conveyor side
    return latencies


def main() -> None:
    parser = arguments(__doc__ or "", dialects=False)
    parser.add_argument("--pushes", type=int, help="changes measured on each system (default 50, --quick 10)")
    parser.add_argument("--venv", type=Path, default=DEFAULT_VENV, help="where Buildbot is installed")
    args = parser.parse_args()
    pushes = args.pushes or (10 if args.quick else 50)
    report = Report("buildbot_peer")
    try:
        bin_dir = install(args.venv)
    except subprocess.CalledProcessError as exc:
        report.add(
            "peer: conveyor_p50 / buildbot_p50", None, "ratio", note=f"n/a (Buildbot install failed: {exc})"
        )
        finish(report, args)
        raise SystemExit(1) from exc
    with workdir() as base:
        print(f"buildbot {BUILDBOT_VERSION}: {pushes} changes", flush=True)
        theirs = measure_buildbot(bin_dir, base, pushes=pushes)
        print(f"conveyor (sqlite, connected agent): {pushes} pushes", flush=True)
        ours = measure_conveyor("sqlite", base, pushes=pushes, label="peer").to_shell
    conveyor_p50, buildbot_p50 = percentile(ours, 50), percentile(theirs, 50)
    report.add(
        "peer: Buildbot change -> first shell command p50",
        buildbot_p50,
        "ms",
        note=f"{pushes} changes, buildbot {BUILDBOT_VERSION}",
    )
    report.add("peer: Buildbot p90", percentile(theirs, 90), "ms")
    report.add(
        "peer: Conveyor webhook -> first shell command p50",
        conveyor_p50,
        "ms",
        note=f"{pushes} pushes, SQLite",
    )
    report.add("peer: Conveyor p90", percentile(ours, 90), "ms")
    ratio = conveyor_p50 / buildbot_p50
    report.add(
        "peer: conveyor_p50 / buildbot_p50",
        ratio,
        "ratio",
        target=f"<= {RATIO_TARGET}",
        met=ratio <= RATIO_TARGET,
    )
    finish(report, args)


if __name__ == "__main__":
    main()
