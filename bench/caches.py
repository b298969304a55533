"""Dependency caches (docs/design/caches.md §8, issue 39's bench): (a) a warm-cache run against a cold one
for the same job, and (b) the restore throughput of a cache entry against `tar --zstd -xf` of the same
tarball from local disk, measured in the same run.

Conveyor's side is what a job sees: a real `conveyor server` (SQLite) and a real `conveyor agent`; a job
whose `install` step wraps "create a venv and pip-install wheels from a local directory into it" in
`ctx.cache(KEY, ["venv"])`, and whose `check` step imports the packages from the venv (a restored venv must
work). The wheels are repacked, offline, from distributions installed in this interpreter's environment
(SQLAlchemy, pydantic, httpx, Jinja2, …: real packages, real file counts). A cold run takes a new key
(miss: `python -m venv`, `pip install --no-index --no-deps`, then the save); the warm run after it takes
the same key (exact hit: the restore alone). Before it, the agent's own store of entries is emptied (as
on an agent that never ran the job), so that warm restore is the whole path: lookup, download over HTTP,
SHA-256 check, zstd decompression, tar extraction; a third run then restores the copy the agent kept
(lookup, no download).

(a) is the install step's duration as the server recorded it (`steps.duration_ms`: restore, work and save
included), cold against warm. (b) times the restore inside the warm step (entering `ctx.cache`) against
`tar --zstd -xf` of the same entry's blob, copied from the server's blob store to local disk and extracted
into an empty directory, interleaved run by run; both rates are MB of the restored tree (the bytes of its
files) per second; target: Conveyor at least 50 % of tar. For context, without a target: the restore from
the agent's own store, and the extraction alone (`agent.caches.restore_archive` on the local file, in this
process). Each figure is the median of `--samples` cold/warm rounds after a warm-up round.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import os
import re
import shutil
import statistics
import subprocess
import tarfile
import time
import zipfile
from pathlib import Path
from typing import Any

from bench.harness import (
    Report,
    Server,
    arguments,
    clean_environ,
    conveyor_command,
    finish,
    fresh_database,
    make_repo,
    new_commit,
    running_server,
    stop_process,
    wait_until,
    workdir,
)

RATIO_TARGET = 50.0
MB = 1_000_000
# Installed distributions repacked as the job's wheels (those missing here are skipped).
PACKAGES = (
    "SQLAlchemy",
    "pydantic",
    "pydantic_core",
    "alembic",
    "Mako",
    "Jinja2",
    "MarkupSafe",
    "httpx",
    "httpcore",
    "anyio",
    "h11",
    "idna",
    "sniffio",
    "certifi",
    "click",
    "typer",
    "rich",
    "pygments",
    "wcmatch",
    "bracex",
    "zstandard",
    "websockets",
    "starlette",
    "fastapi",
    "uvicorn",
    "prometheus_client",
    "annotated_types",
    "typing_extensions",
    "hypothesis",
)
# Run in the job's venv: each repacked project is installed there, and a few import.
CHECK = """
import importlib.metadata, jinja2, click, wcmatch
found = {{d.metadata["Name"].replace("-", "_").lower() for d in importlib.metadata.distributions()}}
missing = {{p.lower() for p in {projects}}} - found
assert not missing, missing
"""
QUICK_PACKAGES = ("Jinja2", "MarkupSafe", "click", "idna", "h11", "bracex", "wcmatch", "typing_extensions")
WORKFLOW = """
import os, shutil, sys, time
from conveyor import push, workflow

ci = workflow("ci", on=[push(branches=["main"])])
build = ci.job("build", runs_on=["linux"])

@build.step
def install(ctx):
    key = open(KEY_FILE).read().strip()
    venv = ctx.workspace / "venv"
    shutil.rmtree(venv, ignore_errors=True)  # a reused workspace must not make a miss look warm
    started = time.perf_counter()
    with ctx.cache(key, ["venv"]) as hit:
        restored = time.perf_counter() - started
        if not hit:
            ctx.sh([sys.executable, "-m", "venv", str(venv)], quiet=True)
            wheels = sorted(p.path for p in os.scandir(WHEELS) if p.name.endswith(".whl"))
            ctx.sh([str(venv / "bin" / "python"), "-m", "pip", "--isolated", "install", "--quiet",
                    "--no-index", "--no-deps", "--disable-pip-version-check", *wheels], quiet=True)
    return {"kind": hit.kind, "restore_s": restored, "work_s": time.perf_counter() - started - restored}

@build.step
def check(ctx):
    # The venv works, restored or not: every wheel is installed, and packages import (with their deps).
    ctx.sh([str(ctx.workspace / "venv" / "bin" / "python"), "-c", CHECK], quiet=True)
"""


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def repack_wheel(name: str, out: Path) -> str | None:
    """A wheel of the installed distribution `name` in `out` (its files as installed, without scripts and
    byte code, with a fresh RECORD); its project name, or None when it is not installed here."""
    try:
        dist = importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        return None
    files = [f for f in dist.files or [] if not str(f).startswith("..") and "__pycache__" not in f.parts]
    info = next((f.parts[0] for f in files if f.parts[0].endswith(".dist-info")), None)
    if info is None:
        return None
    wheel_meta = (dist.read_text("WHEEL") or "").splitlines()
    tag = next(
        (line.split(":", 1)[1].strip() for line in wheel_meta if line.startswith("Tag:")), "py3-none-any"
    )
    project = dist.metadata["Name"].replace("-", "_")
    target = out / f"{project}-{dist.version}-{tag}.whl"
    records: list[str] = []
    skipped = {"RECORD", "INSTALLER", "REQUESTED", "direct_url.json"}
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as archive:
        for file in files:
            if file.parts[0] == info and file.name in skipped:
                continue
            path = Path(str(file.locate()))
            if not path.is_file():
                continue
            data = path.read_bytes()
            archive.writestr(str(file), data)
            records.append(_record_line(str(file), data))
        records.append(f"{info}/RECORD,,")
        archive.writestr(f"{info}/RECORD", "\n".join(records) + "\n")
    return project


def tree_bytes(blob: Path) -> int:
    """The bytes of the regular files an entry holds (what a restore writes)."""
    import zstandard

    with open(blob, "rb") as raw, zstandard.ZstdDecompressor().stream_reader(raw) as reader:
        with tarfile.open(fileobj=reader, mode="r|") as tar:
            return sum(member.size for member in tar if member.isfile())


def tar_seconds(blob: Path, base: Path) -> float:
    """`tar --zstd -xf` of the entry into an empty directory (removed afterwards)."""
    into = base / "tar-x"
    shutil.rmtree(into, ignore_errors=True)
    into.mkdir()
    try:
        started = time.perf_counter()
        done = subprocess.run(
            ["tar", "--zstd", "-xf", str(blob), "-C", str(into)], capture_output=True, text=True
        )
        elapsed = time.perf_counter() - started
        if done.returncode != 0:
            raise RuntimeError(f"tar exited {done.returncode}: {done.stderr[-2000:]}")
        return elapsed
    finally:
        shutil.rmtree(into, ignore_errors=True)


def extract_seconds(blob: Path, base: Path) -> float:
    """The agent's extraction alone (`restore_archive`) of the local file into empty roots."""
    from conveyor.agent.caches import Roots, restore_archive

    into = base / "restore-x"
    shutil.rmtree(into, ignore_errors=True)
    roots = Roots(into / "workspace", into / "home")
    roots.workspace.mkdir(parents=True)
    try:
        started = time.perf_counter()
        with open(blob, "rb") as source:
            restore_archive(roots, source)
        return time.perf_counter() - started
    finally:
        shutil.rmtree(into, ignore_errors=True)


def agent_process(server: Server, home: Path) -> subprocess.Popen[bytes]:
    """A real `conveyor agent` connected to `server`, keeping the entries it uses (its default store)."""
    token = server.agent_token(["linux"])
    home.mkdir(parents=True, exist_ok=True)
    log = open(home.parent / f"{home.name}.log", "ab")
    proc = subprocess.Popen(
        conveyor_command("agent", "--url", server.ws_url, "--labels", "linux", "--home", str(home)),
        env=clean_environ({"CONVEYOR_AGENT_TOKEN": token}),
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )
    log.close()
    return proc


class Conveyor:
    """A server with a local source holding the workflow (an agent runs its jobs)."""

    def __init__(self, server: Server, repo: Path, key_file: Path) -> None:
        self.server = server
        self.repo = repo
        self.key_file = key_file
        self.source_id = server.api_ok(
            "POST", "/sources", json={"kind": "local", "name": "bench-app", "path": str(repo)}
        )["id"]

    def run(self, key: str, label: str) -> dict[str, Any]:
        """One run with `key`: the install step's outputs and its recorded duration (`step_s`)."""
        self.key_file.write_text(key)
        sha = new_commit(self.repo, f"bench {label}")
        delivery = self.server.api_ok(
            "POST", f"/sources/{self.source_id}/trigger", json={"ref": "refs/heads/main", "sha": sha}
        )["delivery"]

        def run_id() -> str | None:
            runs = self.server.api_ok("GET", f"/deliveries/{delivery}")["runs"]
            return str(runs[0]) if runs else None

        found = wait_until(run_id, timeout=60, what="the run", poll=0.05)

        def ended() -> dict[str, Any] | None:
            run: dict[str, Any] = self.server.api_ok("GET", f"/runs/{found}")
            return run if run["status"] in ("success", "failed", "cancelled") else None

        run = wait_until(ended, timeout=600, what=f"run {found}", poll=0.1)
        job = self.server.api_ok("GET", f"/runs/{found}/jobs")["items"][0]
        if run["status"] != "success":
            text = self.server.api_ok("GET", f"/runs/{found}/jobs/{job['id']}/logs").get("text", "")
            raise RuntimeError(
                f"run {found} {run['status']}: {run.get('reason')}; its log ends:\n{text[-3000:]}"
            )
        step = next(s for s in job["steps"] if s["name"] == "install")
        text = self.server.api_ok("GET", f"/runs/{found}/jobs/{job['id']}/logs").get("text", "")
        # The agent's own account of the restore (the step logs it; None from a build that does not).
        timed = re.search(r"(?:checked in ([0-9.]+) s, )?extraction ([0-9.]+) s", text)
        return {
            **job["outputs"]["install"],
            "step_s": int(step["duration_ms"]) / 1000,
            "agent_download_s": float(timed[1]) if timed and timed[1] else None,
            "agent_extract_s": float(timed[2]) if timed else None,
        }

    def blob(self, key: str) -> Path:
        """The stored blob of the entry `key` (the filesystem store's file)."""
        items = self.server.api_ok("GET", "/caches", params={"key_prefix": key})["items"]
        sha256 = next(item["sha256"] for item in items if item["key"] == key)
        return self.server.home / "blobs" / "sha256" / sha256[:2] / sha256


def measure(
    base: Path, wheels: Path, projects: list[str], samples: int
) -> tuple[dict[str, list[float]], int, int]:
    """Samples of the cold and warm install step, the warm restore and the baselines; the entry's size
    and the bytes of the tree it restores."""
    key_file = base / "key.txt"
    source = (
        WORKFLOW.replace("KEY_FILE", repr(str(key_file)))
        .replace("WHEELS", repr(str(wheels)))
        .replace("CHECK", repr(CHECK.format(projects=sorted(projects))))
    )
    repo = make_repo(base / "repo", {"ci": source})
    times: dict[str, list[float]] = {}
    entry_size = tree = 0
    with fresh_database("sqlite", base) as url, running_server(base / "home", url) as server:
        agent = agent_process(server, base / "agent")
        try:
            conveyor = Conveyor(server, repo, key_file)
            for index in range(samples + 1):  # the first round warms up (runner, page cache, pip's imports)
                key = f"venv-{index}-{os.urandom(4).hex()}"
                cold = conveyor.run(key, f"cold {index}")
                # The agent kept what it saved: emptied, the warm run downloads the entry (and keeps it),
                # and the next one restores the agent's own copy.
                shutil.rmtree(base / "agent" / "caches", ignore_errors=True)
                warm = conveyor.run(key, f"warm {index}")
                stored = conveyor.run(key, f"warm from the agent's store {index}")
                kinds = (cold["kind"], warm["kind"], stored["kind"])
                if kinds != ("miss", "exact", "exact"):
                    raise RuntimeError(f"expected a miss then two exact hits, got {kinds}")
                local = base / "entry.tar.zst"
                shutil.copyfile(conveyor.blob(key), local)
                entry_size = local.stat().st_size
                tree = tree_bytes(local)
                sample = {
                    "cold step": cold["step_s"],
                    "warm step": warm["step_s"],
                    "cold work": cold["work_s"],
                    "restore": warm["restore_s"],
                    "store restore": stored["restore_s"],
                    # Inside the warm restore, as the agent timed it: the download with its digest, and
                    # the extraction.
                    "agent download": warm["agent_download_s"],
                    "agent extraction": warm["agent_extract_s"],
                    "tar": tar_seconds(local, base),
                    "extract": extract_seconds(local, base),
                }
                print(
                    f"  round {index}{' (warm-up)' if index == 0 else ''}, load {os.getloadavg()[0]:.1f}: "
                    + ", ".join(f"{name} {seconds:.2f} s" for name, seconds in sample.items() if seconds),
                    flush=True,
                )
                if index == 0:
                    continue
                for name, seconds in sample.items():
                    if seconds is not None:
                        times.setdefault(name, []).append(seconds)
        finally:
            stop_process(agent)
    return times, entry_size, tree


def record(report: Report, times: dict[str, list[float]], entry_size: int, tree: int, wheels: int) -> None:
    median = {name: statistics.median(values) for name, values in times.items()}
    note = f"{wheels} wheels, median of {len(times['cold step'])}"
    report.add(
        "caches: install step, cold (miss: venv + pip install + save)", median["cold step"], "s", note=note
    )
    report.add("caches: install step, warm (exact hit: restore)", median["warm step"], "s", note=note)
    report.add(
        "caches: install step, cold / warm",
        median["cold step"] / median["warm step"],
        "x",
        target="> 1 x",
        met=median["cold step"] > median["warm step"],
    )
    size = f"entry {entry_size / MB:.1f} MB, tree {tree / MB:.1f} MB"
    rate = {name: tree / MB / median[name] for name in ("tar", "restore", "extract")}
    report.add("caches: baseline tar --zstd -xf, local file", rate["tar"], "MB/s", note=size)
    report.add(
        "caches: Conveyor restore (lookup, download, digest, extract)", rate["restore"], "MB/s", note=size
    )
    ratio = 100 * rate["restore"] / rate["tar"]
    report.add(
        "caches: restore / tar -x", ratio, "%", target=f">= {RATIO_TARGET:.0f} %", met=ratio >= RATIO_TARGET
    )
    stored = 100 * tree / MB / median["store restore"] / rate["tar"]
    report.add(
        "caches: restore from the agent's own store / tar -x",
        stored,
        "%",
        note=f"{tree / MB / median['store restore']:.2f} MB/s: lookup, no download",
    )
    if "agent extraction" in median:
        report.add(
            "caches: extraction inside the agent's restore (as the agent timed it)",
            median["agent extraction"],
            "s",
            note=f"download and digest {median.get('agent download', float('nan')):.2f} s",
        )
    report.add(
        "caches: extraction alone (restore_archive, local file)",
        rate["extract"],
        "MB/s",
        note="in the bench's process, no lookup",
    )


def main() -> None:
    parser = arguments(__doc__ or "", dialects=False)
    parser.add_argument("--samples", type=int, help="measured cold/warm rounds (default 3, --quick 1)")
    args = parser.parse_args()
    samples = args.samples or (1 if args.quick else 3)
    report = Report("caches")
    with workdir("conveyor-bench-caches-") as base:
        wheels = base / "wheels"
        wheels.mkdir()
        chosen = QUICK_PACKAGES if args.quick else PACKAGES
        projects = [p for p in (repack_wheel(name, wheels) for name in chosen) if p]
        count = len(projects)
        print(f"== caches: {count} wheels, {samples} measured cold/warm rounds", flush=True)
        times, entry_size, tree = measure(base, wheels, projects, samples)
        record(report, times, entry_size, tree, count)
    finish(report, args)


if __name__ == "__main__":
    main()
