"""Artifact throughput (docs/design/artifacts.md §8 scenario 7): upload and download of a 200 MB artifact
through Conveyor, against `cp` of the same file (filesystem store) and against a raw PUT and GET of the
same bytes to the same S3 server (S3 store), measured in the same run.

Conveyor's side is what a job sees: a real `conveyor server` (SQLite) and a real `conveyor agent`; a
two-job run whose first job hard-links the benchmark's file into its workspace and times
`ctx.upload_artifact` (the step asks, the runner relays, the agent streams and hashes the file over HTTP,
the server hashes it into the blob store — a staging file fsynced and renamed, or, the agent having hashed
the file first and announced the digest, an S3 multipart upload straight to its address — and the agent
commits), and whose second job times `ctx.download_artifact` (the server streams the blob, checking its
digest, or with S3 sends the agent to a presigned URL of it; the agent writes a temporary file in the
workspace, hashes it and moves it into place). The S3 server is moto's (`moto.server`, an S3 emulator, started here by the
suite's `tests/support/s3.py`).

Baselines, measured before each run: `cp` of the file to another file of the same filesystem; `curl`
PUT of the file to a key of the same S3 server and `curl` GET of it into a file (SigV4-signed). Each figure
is the median of `--samples` runs after a warm-up run; the ratios are Conveyor's throughput over the
baseline's (target: at least 50 %). For context, without a target: `cp` followed by an fsync (the store
fsyncs a blob before placing it), one SHA-256 pass over the file (each end of a transfer hashes once), and
the S3 calls the store makes for an upload, alone (its multipart PUT to the final key).
"""

from __future__ import annotations

import hashlib
import os
import statistics
import subprocess
import time
import uuid
from collections.abc import AsyncIterator
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
from tests.support.s3 import ACCESS_KEY_ID, REGION, SECRET_ACCESS_KEY, S3Emulator, s3_emulator

RATIO_TARGET = 50.0
MB = 1_000_000
WORKFLOW = """
import os, time
from conveyor import push, workflow

ci = workflow("ci", on=[push(branches=["main"])])

@ci.job(runs_on=["linux"])
def up(ctx):
    target = ctx.workspace / "big.bin"
    os.link(SOURCE, target)
    started = time.perf_counter()
    stored = ctx.upload_artifact("big", "big.bin")
    return {"seconds": time.perf_counter() - started, "size": stored.size}

@ci.job(runs_on=["linux"], needs=["up"])
def down(ctx):
    started = time.perf_counter()
    path = ctx.download_artifact("big", "in")
    seconds = time.perf_counter() - started
    return {"seconds": seconds, "size": path.stat().st_size}
"""


def write_random(path: Path, size: int) -> None:
    """`size` random bytes (incompressible, so nothing on the way can cheat)."""
    with open(path, "wb") as out:
        remaining = size
        while remaining:
            block = os.urandom(min(remaining, 1 << 20))
            out.write(block)
            remaining -= len(block)


def timed(command: list[str]) -> float:
    """Seconds a command takes (it must succeed)."""
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} exited {done.returncode}: {done.stderr[-2000:]}")
    return elapsed


def cp_seconds(source: Path, base: Path) -> float:
    """`cp` of the file to a new file beside it (removed afterwards)."""
    copy = base / f"cp-{uuid.uuid4().hex[:8]}.bin"
    try:
        return timed(["cp", str(source), str(copy)])
    finally:
        copy.unlink(missing_ok=True)


def cp_fsync_seconds(source: Path, base: Path) -> float:
    """`cp`, then fsync of the copy: what the filesystem store also guarantees (the blob is durable)."""
    copy = base / f"cp-{uuid.uuid4().hex[:8]}.bin"
    try:
        started = time.perf_counter()
        timed(["cp", str(source), str(copy)])
        descriptor = os.open(copy, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
        return time.perf_counter() - started
    finally:
        copy.unlink(missing_ok=True)


def sha256_seconds(source: Path) -> float:
    """One SHA-256 pass over the file with hashlib in 1 MiB reads, as each end of a transfer does."""
    digest = hashlib.sha256()
    started = time.perf_counter()
    with open(source, "rb") as handle:
        while block := handle.read(1 << 20):
            digest.update(block)
    return time.perf_counter() - started


def store_calls_seconds(source: Path, endpoint: str, bucket: str) -> float:
    """The S3 calls the store makes for one upload whose digest the agent announced, alone: a multipart
    upload of the file with the store's part size and concurrency, to its final key."""
    import asyncio

    import obstore
    from obstore.store import S3Store

    from conveyor.blobs.s3 import PART_BYTES

    store = S3Store(
        bucket,
        config={
            "endpoint": endpoint,
            "virtual_hosted_style_request": False,
            "region": REGION,
            "access_key_id": ACCESS_KEY_ID,
            "secret_access_key": SECRET_ACCESS_KEY,
        },
        client_options={"allow_http": True},
    )

    async def blocks() -> AsyncIterator[bytes]:
        with open(source, "rb") as handle:
            while block := handle.read(1 << 20):
                yield block

    async def calls() -> float:
        final = f"raw/{uuid.uuid4().hex}"
        started = time.perf_counter()
        await obstore.put_async(store, final, blocks(), chunk_size=PART_BYTES, max_concurrency=4)
        elapsed = time.perf_counter() - started
        await obstore.delete_async(store, final)
        return elapsed

    return asyncio.run(calls())


def raw_s3_seconds(source: Path, endpoint: str, bucket: str, base: Path) -> tuple[float, float]:
    """(PUT, GET) seconds of the file as one object of the S3 server, by `curl` signing its requests
    (SigV4, the same credentials as the server's); the object is deleted afterwards."""
    key = f"{endpoint}/{bucket}/raw/{uuid.uuid4().hex}"
    back = base / f"get-{uuid.uuid4().hex[:8]}.bin"
    # moto takes any credentials; the raw requests sign with the ones the server is given.
    signed = [
        "curl",
        "-sSf",
        "--aws-sigv4",
        f"aws:amz:{REGION}:s3",
        "--user",
        f"{ACCESS_KEY_ID}:{SECRET_ACCESS_KEY}",
    ]
    try:
        put = timed([*signed, "-o", "/dev/null", "-T", str(source), key])
        get = timed([*signed, "-o", str(back), key])
        if back.stat().st_size != source.stat().st_size:
            raise RuntimeError(f"the raw GET returned {back.stat().st_size} bytes")
    finally:
        back.unlink(missing_ok=True)
        subprocess.run([*signed, "-X", "DELETE", "-o", "/dev/null", key], check=False)
    return put, get


def agent_process(server: Server, home: Path) -> subprocess.Popen[bytes]:
    """A real `conveyor agent` connected to `server`."""
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

    def __init__(self, server: Server, repo: Path) -> None:
        self.server = server
        self.repo = repo
        self.source_id = server.api_ok(
            "POST", "/sources", json={"kind": "local", "name": "bench-app", "path": str(repo)}
        )["id"]

    def run(self, index: int) -> tuple[float, float]:
        """One run: (upload seconds, download seconds) as the steps measured them."""
        sha = new_commit(self.repo, f"bench run {index}")
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
        if run["status"] != "success":
            raise RuntimeError(f"run {found} {run['status']}: {run.get('reason')} (see the agent's log)")
        jobs = {j["name"]: j for j in self.server.api_ok("GET", f"/runs/{found}/jobs")["items"]}
        up = jobs["up"]["outputs"]["up"]
        down = jobs["down"]["outputs"]["down"]
        return float(up["seconds"]), float(down["seconds"])


def measure(
    store: str, base: Path, source: Path, samples: int, emulator: S3Emulator | None
) -> dict[str, list[float]]:
    """Samples of Conveyor's upload and download and of the store's baseline, interleaved."""
    env: dict[str, str] = {}
    bucket = ""
    if emulator is not None:
        bucket = emulator.create_bucket()
        env = emulator.env(bucket)
    times: dict[str, list[float]] = {}
    repo = make_repo(base / f"repo-{store}", {"ci": WORKFLOW.replace("SOURCE", repr(str(source)))})
    with (
        fresh_database("sqlite", base) as url,
        running_server(base / f"home-{store}", url, env) as server,
    ):
        agent = agent_process(server, base / f"agent-{store}")
        try:
            conveyor = Conveyor(server, repo)
            for index in range(samples + 1):  # the first run warms up (runner, venv, page cache)
                sample: dict[str, float] = {}
                if store == "filesystem":
                    sample["cp"] = cp_seconds(source, base)
                    sample["cp + fsync"] = cp_fsync_seconds(source, base)
                    sample["sha256"] = sha256_seconds(source)
                else:
                    assert emulator is not None
                    sample["raw PUT"], sample["raw GET"] = raw_s3_seconds(
                        source, emulator.endpoint, bucket, base
                    )
                    sample["store calls"] = store_calls_seconds(source, emulator.endpoint, bucket)
                sample["upload"], sample["download"] = conveyor.run(index)
                print(
                    f"  {store} run {index}{' (warm-up)' if index == 0 else ''}: "
                    + ", ".join(f"{name} {seconds:.2f} s" for name, seconds in sample.items()),
                    flush=True,
                )
                if index == 0:
                    continue
                for name, seconds in sample.items():
                    times.setdefault(name, []).append(seconds)
        finally:
            stop_process(agent)
    return times


def record(report: Report, store: str, size: int, times: dict[str, list[float]]) -> None:
    """Throughputs (MB/s of the median time), the ratios against the baseline, and the context figures."""
    rate = {name: size / MB / statistics.median(values) for name, values in times.items()}
    note = f"{size / MB:.0f} MB, median of {len(times['upload'])}"
    if store == "filesystem":
        baselines = {"upload": "cp", "download": "cp"}
        report.add("artifacts filesystem: baseline cp", rate["cp"], "MB/s", note=note)
    else:
        baselines = {"upload": "raw PUT", "download": "raw GET"}
        for name in ("raw PUT", "raw GET"):
            report.add(f"artifacts s3: baseline {name}", rate[name], "MB/s", note=f"curl, {note}")
    for way in ("upload", "download"):
        report.add(f"artifacts {store}: Conveyor {way}", rate[way], "MB/s", note=note)
        ratio = 100 * rate[way] / rate[baselines[way]]
        report.add(
            f"artifacts {store}: {way} / {baselines[way]}",
            ratio,
            "%",
            target=f">= {RATIO_TARGET:.0f} %",
            met=ratio >= RATIO_TARGET,
        )
    if store == "filesystem":
        report.add(
            "artifacts filesystem: cp + fsync", rate["cp + fsync"], "MB/s", note="the store also fsyncs"
        )
        report.add(
            "artifacts filesystem: one SHA-256 pass (hashlib)",
            rate["sha256"],
            "MB/s",
            note="each end hashes the bytes once",
        )
        # What the ratio to `cp` could be at most: a store that verifies what it addresses reads the bytes
        # through SHA-256 at least once, and no transfer runs faster than its slowest stage.
        report.add(
            "artifacts filesystem: ceiling, one SHA-256 pass / cp",
            100 * rate["sha256"] / rate["cp"],
            "%",
            note="no hashed transfer can pass it",
        )
        for way in ("upload", "download"):
            report.add(
                f"artifacts filesystem: {way} / one SHA-256 pass",
                100 * rate[way] / rate["sha256"],
                "%",
            )
    else:
        report.add(
            "artifacts s3: the store's S3 calls alone",
            rate["store calls"],
            "MB/s",
            note="its multipart PUT (part size, concurrency) to the final key",
        )
        report.add(
            "artifacts s3: upload / the store's S3 calls alone",
            100 * rate["upload"] / rate["store calls"],
            "%",
            note="what the agent and the server add to the store's own calls",
        )


def main() -> None:
    parser = arguments(__doc__ or "", dialects=False)
    parser.add_argument("--size-mb", type=int, help="artifact size in MB (default 200, --quick 32)")
    parser.add_argument("--samples", type=int, help="measured runs per store (default 3, --quick 1)")
    parser.add_argument(
        "--store", default="filesystem,s3", help="comma-separated stores to measure (filesystem, s3)"
    )
    args = parser.parse_args()
    size = (args.size_mb or (32 if args.quick else 200)) * MB
    samples = args.samples or (1 if args.quick else 3)
    stores = [s.strip() for s in args.store.split(",") if s.strip()]
    if not stores or any(s not in ("filesystem", "s3") for s in stores):
        raise SystemExit(f"--store: choose from filesystem, s3 (got {args.store!r})")
    report = Report("artifacts")
    print(f"== artifacts: {size / MB:.0f} MB, {samples} measured runs per store", flush=True)
    with workdir("conveyor-bench-artifacts-") as base:
        source = base / "artifact.bin"
        write_random(source, size)
        for store in stores:
            if store == "s3":
                with s3_emulator(base) as emulator:
                    times = measure(store, base, source, samples, emulator)
            else:
                times = measure(store, base, source, samples, None)
            record(report, store, size, times)
    finish(report, args)


if __name__ == "__main__":
    main()
