"""Checkout: fetch the job's commit into `<workspace>/src` (docs/design/execution.md §7, step 2).

The clone credential travels only as `http.extraHeader` through `GIT_CONFIG_COUNT`/`GIT_CONFIG_KEY_0`/
`GIT_CONFIG_VALUE_0` in git's environment: never in the URL, an argument, `.git/config` or a log line.
"""

from __future__ import annotations

import asyncio
import base64
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path

from conveyor.agent.spec import RepoSpec
from conveyor.errors import ConveyorError
from conveyor.model.gitnames import commit_id_problem, ref_problem

_HEADER_RE = re.compile(r"^[A-Za-z0-9-]+:\s")


class CheckoutFailed(ConveyorError):
    """git could not produce the commit; the job fails `checkout_failed`."""


def header_line(auth_header: str) -> str:
    """`Name: value` for git's `http.extraHeader`; a bare value is an `Authorization` header."""
    return auth_header if _HEADER_RE.match(auth_header) else f"Authorization: {auth_header}"


def credential_values(auth_header: str | None) -> list[str]:
    """Strings to mask for a clone credential: the header value and, for Basic auth, the password."""
    if not auth_header:
        return []
    value = header_line(auth_header).split(":", 1)[1].strip()
    values = [value]
    scheme, _, token = value.partition(" ")
    if scheme.lower() == "basic" and token:
        try:
            user_password = base64.b64decode(token, validate=True).decode("utf-8")
        except (ValueError, UnicodeDecodeError):
            return values
        values.append(user_password.partition(":")[2])
    elif scheme.lower() in ("bearer", "token") and token:
        values.append(token)
    return [item for item in values if item]


def check_repo_spec(repo: RepoSpec) -> None:
    """Refuse (`CheckoutFailed`) a commit id or ref that git could take for something else.

    The orchestrator checks them where the webhook is normalised; the agent checks again before any git
    call, since the values came from outside and a leading `-` would make git read an option.
    """
    if (problem := commit_id_problem(repo.sha)) is not None:
        raise CheckoutFailed(f"the job's commit {repo.sha[:80]!r} {problem}")
    if repo.ref is not None and (problem := ref_problem(repo.ref)) is not None:
        raise CheckoutFailed(f"the job's ref {repo.ref[:80]!r} {problem}")


def git_environment(base: Mapping[str, str], auth_header: str | None) -> dict[str, str]:
    """git's environment: no prompts, and the credential (if any) as an extra HTTP header."""
    env = dict(base)
    env["GIT_TERMINAL_PROMPT"] = "0"
    env.pop("GIT_CONFIG_PARAMETERS", None)
    if auth_header:
        env["GIT_CONFIG_COUNT"] = "1"
        env["GIT_CONFIG_KEY_0"] = "http.extraHeader"
        env["GIT_CONFIG_VALUE_0"] = header_line(auth_header)
    return env


def clone_source(clone_url: str) -> str:
    """A local path becomes an absolute `file://` URL; anything else is used as given."""
    if "://" in clone_url or re.match(r"^[\w.-]+@[\w.-]+:", clone_url):
        return clone_url
    return Path(clone_url).resolve().as_uri()


Log = Callable[[str, str], None]


async def run_git(
    args: list[str],
    *,
    cwd: Path,
    env: Mapping[str, str],
    log: Log,
    check: bool = True,
    stdin_text: str | None = None,
) -> tuple[int, str]:
    """Run git, logging the command (`sys`) and its output (`out`); (exit code, output)."""
    log(f"$ git {' '.join(args)}", "sys")
    process = await asyncio.create_subprocess_exec(
        "git",
        *args,
        cwd=cwd,
        env=dict(env),
        stdin=asyncio.subprocess.DEVNULL if stdin_text is None else asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    if stdin_text is not None:
        assert process.stdin is not None
        process.stdin.write(stdin_text.encode("utf-8"))
        await process.stdin.drain()
        process.stdin.close()
    assert process.stdout is not None
    lines: list[str] = []
    async for raw in process.stdout:
        line = raw.decode("utf-8", errors="replace").rstrip("\n")
        lines.append(line)
        log(line, "out")
    code = await process.wait()
    if check and code != 0:
        raise CheckoutFailed(f"git {args[0]} exited with code {code}")
    return code, "\n".join(lines)


def switch_detached(sha: str) -> list[str]:
    """The detached checkout of `sha`. `git switch`, as `git checkout` before git 2.43 takes no
    `--end-of-options` after `--detach`."""
    return ["switch", "-q", "--detach", "--end-of-options", sha]


async def checkout(
    repo: RepoSpec, destination: Path, *, base_env: Mapping[str, str], log: Log, sparse: bool = False
) -> None:
    """`git init`, fetch the SHA at depth 1 (else the ref at depth 50), detached checkout, verify HEAD."""
    check_repo_spec(repo)
    os.makedirs(destination, exist_ok=True)
    env = git_environment(base_env, repo.auth_header)
    await run_git(["init", "-q", str(destination)], cwd=destination.parent, env=env, log=log)
    await run_git(
        ["remote", "add", "--end-of-options", "origin", clone_source(repo.clone_url)],
        cwd=destination,
        env=env,
        log=log,
    )
    fetch_options = ["--no-tags"] + (["--filter=blob:none"] if sparse else [])
    code, _ = await run_git(
        ["fetch", "-q", "--depth", "1", *fetch_options, "--end-of-options", "origin", repo.sha],
        cwd=destination,
        env=env,
        log=log,
        check=False,
    )
    if code != 0:
        if not repo.ref:
            raise CheckoutFailed(f"fetching {repo.sha} failed and the job has no ref to fall back to")
        log(f"fetch by SHA refused; fetching {repo.ref} at depth 50", "sys")
        await run_git(
            ["fetch", "-q", "--depth", "50", *fetch_options, "--end-of-options", "origin", repo.ref],
            cwd=destination,
            env=env,
            log=log,
        )
        code, _ = await run_git(
            ["cat-file", "-e", "--end-of-options", f"{repo.sha}^{{commit}}"],
            cwd=destination,
            env=env,
            log=log,
            check=False,
        )
        if code != 0:
            raise CheckoutFailed(f"commit {repo.sha} is not within 50 commits of {repo.ref}")
    if sparse:
        await run_git(
            ["sparse-checkout", "set", "--no-cone", "/.conveyor/"], cwd=destination, env=env, log=log
        )
    await run_git(switch_detached(repo.sha), cwd=destination, env=env, log=log)
    _, head = await run_git(["rev-parse", "HEAD"], cwd=destination, env=env, log=log)
    if head.strip().splitlines()[-1:] != [repo.sha]:
        raise CheckoutFailed(f"HEAD is {head.strip()!r}, expected {repo.sha}")
