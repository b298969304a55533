"""Per-repository git mirrors on the agent: `<home>/mirrors/<key>.git` (docs/agent.md, "The mirror").

A job fetches only the commit it needs into its repository's bare mirror (nothing when the commit is already
there), pins it as `refs/conveyor/<sha>`, and gets a fresh `<workspace>/src` whose object files are hard
links to the mirror's: what `git clone --local` does, which git refuses for a shallow source. The checkout
owns its links, so it stays valid when the mirror is later repacked, pruned or deleted.

The credential rule of `checkout.py` holds here too: the clone URL is given to `git fetch` on the command line
(it holds no token) and the credential only through git's environment (`git_environment`), so nothing of
it reaches the mirror's config, a remote, argv or a log line. Jobs of one agent (one runner process each)
serialise on a mirror with an `fcntl.flock` lock file beside it. A mirror that does not work is deleted
and rebuilt once; if that fails too the job checks out directly, as without a mirror.
"""

from __future__ import annotations

import asyncio
import errno
import fcntl
import hashlib
import os
import shutil
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from itertools import count
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from conveyor.agent.checkout import (
    CheckoutFailed,
    Log,
    check_repo_spec,
    checkout,
    clone_source,
    git_environment,
    run_git,
    switch_detached,
)
from conveyor.agent.spec import RepoSpec
from conveyor.errors import ConveyorError

DEFAULT_MAX_BYTES = 2 * 1024**3
KEEP_PINNED_COMMITS = 50
MAINTENANCE_SLACK = 10
LOCK_WAIT_S = 600.0
PIN_PREFIX = "refs/conveyor/"
# Neither fetch nor gc may leave a detached gc running after the lock is released: it would delete pack
# files another job is linking at that moment.
_NO_BACKGROUND_GC = ["-c", "gc.autoDetach=false", "-c", "maintenance.autoDetach=false"]
_deletions = count()


class MirrorUnavailable(ConveyorError):
    """The mirror cannot serve this job (lock not obtained, rebuild failed); the job checks out directly."""


class CommitNotFound(CheckoutFailed):
    """The repository answered, but the commit is not within reach: rebuilding the mirror would not help."""


def normalised_url(clone_url: str) -> str:
    """The clone URL as a mirror key sees it: local paths absolute, scheme and host lower-case, no `.git`."""
    source = clone_source(clone_url).rstrip("/")
    parts = urlsplit(source)
    if not parts.scheme or parts.scheme == "file":
        return source
    path = parts.path[: -len(".git")] if parts.path.endswith(".git") else parts.path
    return urlunsplit((parts.scheme.lower(), parts.netloc.lower(), path, parts.query, ""))


def mirror_key(clone_url: str) -> str:
    """The mirror's directory name (without `.git`): a hash of the normalised clone URL."""
    return hashlib.sha256(normalised_url(clone_url).encode("utf-8")).hexdigest()[:32]


@dataclass(frozen=True)
class MirrorUsage:
    """One mirror as eviction sees it: its name, bytes on disk and when a job last used it."""

    name: str
    size: int
    last_used: float


def mirrors_to_evict(mirrors: Sequence[MirrorUsage], max_bytes: int, keep: Collection[str]) -> list[str]:
    """Least recently used first, the mirrors to delete so the rest fit in `max_bytes`; never one in `keep`.

    When the kept ones alone exceed the bound, every other mirror goes and the kept ones stay.
    """
    total = sum(mirror.size for mirror in mirrors)
    evicted: list[str] = []
    for mirror in sorted(mirrors, key=lambda item: (item.last_used, item.name)):
        if total <= max_bytes:
            break
        if mirror.name in keep:
            continue
        evicted.append(mirror.name)
        total -= mirror.size
    return evicted


def pins_to_drop(pins_newest_first: Sequence[str], keep: int = KEEP_PINNED_COMMITS) -> list[str]:
    """The `refs/conveyor/*` refs beyond the newest `keep`."""
    return list(pins_newest_first[keep:])


def _try_lock(path: Path) -> int | None:
    """An exclusive `flock` on `path` (created if needed) without waiting; the descriptor, or None if held."""
    while True:
        descriptor = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(descriptor)
            return None
        except BaseException:
            os.close(descriptor)
            raise
        # Eviction deletes a lock file while holding it: a lock taken on a file no longer at `path` guards
        # nothing, so open the current one again.
        try:
            current = os.stat(path).st_ino
        except FileNotFoundError:
            current = None
        if current == os.fstat(descriptor).st_ino:
            return descriptor
        os.close(descriptor)


def _pins(mirror: Path) -> set[str]:
    """The `refs/conveyor/*` refs of a mirror, loose or packed, read from its files (no git process)."""
    names: set[str] = set()
    loose = mirror / PIN_PREFIX
    try:
        names.update(f"{PIN_PREFIX}{name}" for name in os.listdir(loose))
    except FileNotFoundError:
        pass
    try:
        packed = (mirror / "packed-refs").read_text(encoding="utf-8")
    except FileNotFoundError:
        return names
    for line in packed.splitlines():
        _, _, name = line.partition(" ")
        if name.startswith(PIN_PREFIX):
            names.add(name)
    return names


def _has_ref(mirror: Path, ref: str) -> bool:
    """Whether `ref` exists in the mirror, loose or packed."""
    return (mirror / ref).is_file() or ref in _pins(mirror)


def _tree_size(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                continue
    return total


def _remove(path: Path) -> None:
    """Delete a directory tree; renamed away first so a half-deleted one is never found under its name."""
    if not os.path.lexists(path):
        return
    doomed = path.with_name(f".{path.name}.deleting-{os.getpid()}-{next(_deletions)}")
    try:
        os.rename(path, doomed)
    except OSError:
        doomed = path
    shutil.rmtree(doomed, ignore_errors=True)


def _link_objects(mirror_objects: Path, objects: Path) -> None:
    """Hard-link every object file of the mirror into `objects` (copy across file systems)."""
    for root, _, files in os.walk(mirror_objects):
        relative = Path(root).relative_to(mirror_objects)
        target = objects / relative
        target.mkdir(parents=True, exist_ok=True)
        for name in files:
            if name.startswith("tmp_"):  # a pack a killed fetch was still writing
                continue
            source = Path(root) / name
            try:
                os.link(source, target / name)
            except FileExistsError:
                continue
            except OSError as error:
                if error.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK):
                    raise
                shutil.copy2(source, target / name)


class Mirrors:
    """The mirrors under one directory (`<agent home>/mirrors`), at most `max_bytes` of them in total."""

    def __init__(
        self,
        root: Path,
        *,
        max_bytes: int = DEFAULT_MAX_BYTES,
        lock_wait_s: float = LOCK_WAIT_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.root = root
        self.max_bytes = max_bytes
        self.lock_wait_s = lock_wait_s
        self.clock = clock

    def path_of(self, clone_url: str) -> Path:
        """Where the repository's mirror lives."""
        return self.root / f"{mirror_key(clone_url)}.git"

    async def checkout(
        self, repo: RepoSpec, destination: Path, *, base_env: Mapping[str, str], log: Log
    ) -> None:
        """The job's commit into a fresh `destination` through the mirror; direct checkout if that fails."""
        check_repo_spec(repo)
        try:
            await self._checkout(repo, destination, base_env=base_env, log=log)
        except MirrorUnavailable as error:
            log(f"mirror not used: {error}; checking out directly from the clone URL", "sys")
            _remove(destination)
            await checkout(repo, destination, base_env=base_env, log=log)

    async def _checkout(
        self, repo: RepoSpec, destination: Path, *, base_env: Mapping[str, str], log: Log
    ) -> None:
        mirror = self.path_of(repo.clone_url)
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise MirrorUnavailable(f"cannot create {self.root}: {error}") from None
        async with self._locked(mirror, log):
            fetched = False
            created = not (mirror / "HEAD").is_file()
            for attempt in (1, 2):
                try:
                    if attempt == 2:
                        log(f"rebuilding the mirror {mirror.name}", "sys")
                        await asyncio.to_thread(_remove, mirror)
                        created = True
                    # The new repository is made while the mirror fetches: the two are independent.
                    update, prepare = await asyncio.gather(
                        self._update(mirror, repo, base_env=base_env, log=log),
                        self._prepare(repo, destination, base_env=base_env, log=log),
                        return_exceptions=True,
                    )
                    for outcome in (update, prepare):
                        if isinstance(outcome, BaseException):
                            raise outcome
                    fetched = bool(update) or fetched
                    await self._populate(mirror, repo, destination, base_env=base_env, log=log)
                    break
                except CommitNotFound:
                    raise
                except (CheckoutFailed, OSError) as error:
                    await asyncio.to_thread(_remove, destination)
                    if attempt == 2:
                        raise MirrorUnavailable(f"the rebuilt mirror failed too ({error})") from None
                    log(f"the mirror {mirror.name} is unusable ({error})", "sys")
            try:
                os.utime(mirror)  # the last use, for eviction
                if fetched:
                    await self._maintain(mirror, created=created, base_env=base_env, log=log)
            except OSError as error:  # the job has its checkout: failed upkeep is only logged
                log(f"mirror upkeep failed: {error}", "sys")

    def _locked(self, mirror: Path, log: Log) -> _MirrorLock:
        return _MirrorLock(mirror.with_suffix(".lock"), self, log)

    async def _update(self, mirror: Path, repo: RepoSpec, *, base_env: Mapping[str, str], log: Log) -> bool:
        """Make the commit present and pinned in the mirror (created if missing); whether it fetched.

        Every probe here is a file look-up rather than a git process: on a warm mirror the checkout is the
        only git work. A pin whose objects turn out to be damaged fails the checkout, which rebuilds.
        """
        env = git_environment(base_env, None)
        pin = f"{PIN_PREFIX}{repo.sha}"
        if (mirror / "HEAD").is_file() and _has_ref(mirror, pin):
            log(f"commit {repo.sha} is already in the mirror {mirror.name}", "sys")
            return False
        if not (mirror / "HEAD").is_file():
            if os.path.lexists(mirror):  # noqa: ASYNC240 (one stat is not worth a thread)
                raise CheckoutFailed(f"{mirror.name} is not a git repository")
            await run_git(
                ["init", "-q", "--bare", "--template=", str(mirror)], cwd=self.root, env=env, log=log
            )
        git_dir = ["--git-dir", str(mirror)]
        source = clone_source(repo.clone_url)
        fetch_env = git_environment(base_env, repo.auth_header)
        fetch = [*git_dir, *_NO_BACKGROUND_GC, "fetch", "-q", "--no-tags", "--no-auto-gc"]
        code, _ = await run_git(
            [*fetch, "--depth", "1", "--end-of-options", source, f"+{repo.sha}:{pin}"],
            cwd=self.root,
            env=fetch_env,
            log=log,
            check=False,
        )
        if code == 0:
            return True
        code, _ = await run_git(
            [*git_dir, "rev-parse", "--is-bare-repository"], cwd=self.root, env=env, log=_silent, check=False
        )
        if code != 0:
            raise CheckoutFailed(f"{mirror.name} is not a usable git repository")
        if not repo.ref:
            raise CheckoutFailed(f"fetching {repo.sha} failed and the job has no ref to fall back to")
        log(f"fetch by SHA refused; fetching {repo.ref} at depth 50", "sys")
        await run_git(
            [*fetch, "--depth", "50", "--end-of-options", source, repo.ref],
            cwd=self.root,
            env=fetch_env,
            log=log,
        )
        code, _ = await run_git(
            [*git_dir, "cat-file", "-e", "--end-of-options", f"{repo.sha}^{{commit}}"],
            cwd=self.root,
            env=env,
            log=log,
            check=False,
        )
        if code != 0:
            raise CommitNotFound(f"commit {repo.sha} is not within 50 commits of {repo.ref}")
        await run_git(
            [*git_dir, "update-ref", "--end-of-options", pin, repo.sha], cwd=self.root, env=env, log=log
        )
        return True

    async def _prepare(
        self, repo: RepoSpec, destination: Path, *, base_env: Mapping[str, str], log: Log
    ) -> None:
        """A fresh, empty repository at `destination` with `origin` set (no objects yet)."""
        env = git_environment(base_env, None)
        await asyncio.to_thread(_remove, destination)
        destination.parent.mkdir(parents=True, exist_ok=True)
        await run_git(
            ["init", "-q", "--template=", str(destination)], cwd=destination.parent, env=env, log=log
        )
        await run_git(
            ["remote", "add", "--end-of-options", "origin", clone_source(repo.clone_url)],
            cwd=destination,
            env=env,
            log=log,
        )

    async def _populate(
        self, mirror: Path, repo: RepoSpec, destination: Path, *, base_env: Mapping[str, str], log: Log
    ) -> None:
        """Link the mirror's object files into the prepared `destination` and check the commit out detached."""
        env = git_environment(base_env, None)
        git_dir = destination / ".git"
        log(f"linking the objects of the mirror {mirror.name}", "sys")
        await asyncio.to_thread(_link_objects, mirror / "objects", git_dir / "objects")
        if (mirror / "shallow").is_file():
            shutil.copyfile(mirror / "shallow", git_dir / "shallow")
        await run_git(switch_detached(repo.sha), cwd=destination, env=env, log=log)
        head = (git_dir / "HEAD").read_text(encoding="utf-8").strip()  # detached: the commit's SHA itself
        if head != repo.sha:
            raise CheckoutFailed(f"HEAD is {head!r}, expected {repo.sha}")

    async def _maintain(self, mirror: Path, *, created: bool, base_env: Mapping[str, str], log: Log) -> None:
        """After a fetch: drop old pins, `git gc --auto`, evict least recently used mirrors over the bound.

        Pruning and gc run once the pins exceed the kept number by `MAINTENANCE_SLACK` (so about once per that
        many fetches, not on each job's path); eviction runs then and whenever a mirror was created.
        """
        if not created and len(_pins(mirror)) <= KEEP_PINNED_COMMITS + MAINTENANCE_SLACK:
            return
        env = git_environment(base_env, None)
        git_dir = ["--git-dir", str(mirror)]
        try:
            _, listing = await run_git(
                [*git_dir, "for-each-ref", "--sort=-committerdate", "--format=%(refname)", PIN_PREFIX],
                cwd=self.root,
                env=env,
                log=_silent,
            )
            dropped = pins_to_drop([line for line in listing.splitlines() if line.startswith(PIN_PREFIX)])
            if dropped:
                await run_git(
                    [*git_dir, "update-ref", "--stdin"],
                    cwd=self.root,
                    env=env,
                    log=_silent,
                    stdin_text="".join(f"delete {ref}\n" for ref in dropped),
                )
                log(f"dropped {len(dropped)} old commit pins from the mirror {mirror.name}", "sys")
            await run_git(
                [*git_dir, *_NO_BACKGROUND_GC, "gc", "--auto", "--quiet"], cwd=self.root, env=env, log=log
            )
        except CheckoutFailed as error:  # the job has its checkout: failed upkeep is only logged
            log(f"mirror upkeep failed: {error}", "sys")
        for name in await asyncio.to_thread(self._evict, mirror.name):
            log(f"evicted the least recently used mirror {name}", "sys")

    def _evict(self, in_use: str) -> list[str]:
        usage: list[MirrorUsage] = []
        for path in self.root.iterdir():
            if path.name.startswith(".") and ".deleting-" in path.name:
                shutil.rmtree(path, ignore_errors=True)  # left by a runner killed while deleting
            elif path.suffix == ".git" and path.is_dir():
                try:
                    last_used = path.stat().st_mtime
                except FileNotFoundError:
                    continue
                usage.append(MirrorUsage(path.name, _tree_size(path), last_used))
        evicted: list[str] = []
        for name in mirrors_to_evict(usage, self.max_bytes, keep={in_use}):
            path = self.root / name
            lock = path.with_suffix(".lock")
            descriptor = _try_lock(lock)
            if descriptor is None:  # a job is using it
                continue
            try:
                _remove(path)
                lock.unlink(missing_ok=True)
            finally:
                os.close(descriptor)
            evicted.append(name)
        return evicted


class _MirrorLock:
    """`async with`: the mirror's lock file held, polled for without blocking the event loop."""

    def __init__(self, path: Path, mirrors: Mirrors, log: Log) -> None:
        self.path = path
        self.mirrors = mirrors
        self.log = log
        self.descriptor: int | None = None

    async def __aenter__(self) -> None:
        clock = self.mirrors.clock
        deadline = clock() + self.mirrors.lock_wait_s
        pause = 0.005
        told = False
        while True:
            try:
                self.descriptor = _try_lock(self.path)
            except OSError as error:
                raise MirrorUnavailable(f"cannot lock {self.path}: {error}") from None
            if self.descriptor is not None:
                return
            if not told:
                self.log("waiting for the mirror: another job of this agent is using it", "sys")
                told = True
            if clock() >= deadline:
                raise MirrorUnavailable(f"the mirror was busy for {self.mirrors.lock_wait_s:.0f} s")
            await asyncio.sleep(pause)  # polling: a thread blocked in flock could not be cancelled
            pause = min(pause * 2, 0.1)

    async def __aexit__(self, *exc_info: object) -> None:
        if self.descriptor is not None:
            os.close(self.descriptor)
            self.descriptor = None


def _silent(text: str, stream: str) -> None:
    """The log of probes whose failure is expected and of routine upkeep: kept out of the job's log."""
