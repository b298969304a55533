"""A faithful FAKE of the GitHub REST API parts Conveyor uses, backed by a real git repository.

Serves the contents API (raw), compare, commits, commit statuses and check runs (recorded), checks the bearer
token when one is configured, can answer errors on demand, and signs and posts webhooks exactly as
GitHub does (`X-GitHub-Event`, `X-GitHub-Delivery`, `X-Hub-Signature-256`). It runs on a real
socket (uvicorn in a thread) so a real `conveyor server` process can call it.
"""

from __future__ import annotations

import subprocess
import threading
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from conveyor.ingest.signatures import github_signature
from tests.support.http import HTTP
from tests.support.processes import free_port
from tests.support.waiting import wait_until


def git(repo: Path, *args: str) -> str:
    """Run git in `repo` and return stdout."""
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


@dataclass
class RecordedStatus:
    """One `POST /statuses/{sha}` the fake received."""

    repo: str
    sha: str
    state: str
    context: str
    description: str
    target_url: str | None


CHECK_RUN_STATUSES = ("queued", "in_progress", "completed")
CHECK_RUN_CONCLUSIONS = (
    "action_required",
    "cancelled",
    "failure",
    "neutral",
    "success",
    "skipped",
    "stale",
    "timed_out",
)
# GitHub's limit on a check run's `output.summary`.
CHECK_RUN_SUMMARY_MAX = 65535


@dataclass
class CheckRunRequest:
    """One `POST …/check-runs` or `PATCH …/check-runs/{id}` the fake accepted, with its JSON body."""

    method: str
    repo: str
    check_run_id: int
    body: dict[str, Any]


@dataclass
class FakeGitHub:
    """The fake server; `repos` maps `owner/name` to a local git repository."""

    repos: dict[str, Path]
    token: str | None = None
    statuses: list[RecordedStatus] = field(default_factory=list)
    check_runs: dict[int, dict[str, Any]] = field(default_factory=dict)
    check_run_requests: list[CheckRunRequest] = field(default_factory=list)
    fail_next: list[int] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)
    # The raw query string of each request, in the order of `requests`.
    queries: list[str] = field(default_factory=list)
    port: int = field(default_factory=free_port)

    @property
    def url(self) -> str:
        """Base URL of the fake API (a source's `api_url`)."""
        return f"http://127.0.0.1:{self.port}"

    def source_body(self, repo: str, secret: str, **extra: str) -> dict[str, str]:
        """The admin API body that creates a GitHub source for `repo` served by this fake."""
        return {
            "kind": "github",
            "name": repo,
            "repo": repo,
            "api_url": self.url,
            "webhook_secret": secret,
            **extra,
        }

    def app(self) -> FastAPI:
        """The ASGI app."""
        app = FastAPI()

        def refuse(request: Request) -> Response | None:
            self.requests.append(f"{request.method} {request.url.path}")
            self.queries.append(request.url.query)
            if self.fail_next:
                return JSONResponse({"message": "injected failure"}, status_code=self.fail_next.pop(0))
            if self.token and request.headers.get("authorization") != f"Bearer {self.token}":
                return JSONResponse({"message": "Bad credentials"}, status_code=401)
            return None

        def repo_path(owner: str, name: str) -> Path | None:
            return self.repos.get(f"{owner}/{name}")

        @app.get("/repos/{owner}/{name}/contents/{path:path}")
        def contents(owner: str, name: str, path: str, request: Request, ref: str = "HEAD") -> Response:
            if (refused := refuse(request)) is not None:
                return refused
            repo = repo_path(owner, name)
            if repo is None:
                return JSONResponse({"message": "Not Found"}, status_code=404)
            shown = subprocess.run(["git", "-C", str(repo), "show", f"{ref}:{path}"], capture_output=True)
            if shown.returncode != 0:
                return JSONResponse({"message": "Not Found"}, status_code=404)
            return Response(shown.stdout, media_type="application/vnd.github.raw")

        @app.get("/repos/{owner}/{name}/commits/{ref}")
        def commit(owner: str, name: str, ref: str, request: Request) -> Response:
            if (refused := refuse(request)) is not None:
                return refused
            repo = repo_path(owner, name)
            found = subprocess.run(
                ["git", "-C", str(repo), "rev-parse", "--verify", "-q", f"{ref}^{{commit}}"],
                capture_output=True,
                text=True,
            )
            if repo is None or found.returncode != 0:
                return JSONResponse({"message": "No commit found"}, status_code=422)
            return JSONResponse({"sha": found.stdout.strip()})

        @app.get("/repos/{owner}/{name}/compare/{spec}")
        def compare(owner: str, name: str, spec: str, request: Request) -> Response:
            if (refused := refuse(request)) is not None:
                return refused
            repo = repo_path(owner, name)
            base, head = spec.split("...", 1)
            names = git(repo, "diff", "--name-only", base, head).split() if repo else []
            return JSONResponse({"files": [{"filename": n} for n in names]})

        @app.post("/repos/{owner}/{name}/statuses/{sha}")
        async def status(owner: str, name: str, sha: str, request: Request) -> Response:
            if (refused := refuse(request)) is not None:
                return refused
            body = await request.json()
            self.statuses.append(
                RecordedStatus(
                    repo=f"{owner}/{name}",
                    sha=sha,
                    state=body["state"],
                    context=body["context"],
                    description=body.get("description", ""),
                    target_url=body.get("target_url"),
                )
            )
            return JSONResponse({"id": len(self.statuses), "state": body["state"]}, status_code=201)

        def check_run_error(repo: Path | None, body: Any, *, creating: bool) -> Response | None:
            """GitHub's 404 / 422 answers for a check run body it would refuse."""
            if repo is None:
                return JSONResponse({"message": "Not Found"}, status_code=404)
            if not isinstance(body, dict):
                return JSONResponse({"message": "Problems parsing JSON"}, status_code=400)
            if creating:
                for name in ("name", "head_sha"):
                    if not isinstance(body.get(name), str) or not body[name]:
                        return JSONResponse({"message": f"{name} wasn't supplied."}, status_code=422)
                known = subprocess.run(
                    ["git", "-C", str(repo), "cat-file", "-e", f"{body['head_sha']}^{{commit}}"],
                    capture_output=True,
                )
                if known.returncode != 0:
                    return JSONResponse({"message": "No commit found for SHA"}, status_code=422)
            if "status" in body and body["status"] not in CHECK_RUN_STATUSES:
                return JSONResponse({"message": "Invalid request: status"}, status_code=422)
            if "conclusion" in body and body["conclusion"] not in CHECK_RUN_CONCLUSIONS:
                return JSONResponse({"message": "Invalid request: conclusion"}, status_code=422)
            output = body.get("output")
            if output is not None:
                if not isinstance(output, dict) or not all(
                    isinstance(output.get(key), str) for key in ("title", "summary")
                ):
                    return JSONResponse({"message": "Invalid request: output"}, status_code=422)
                if len(output["summary"]) > CHECK_RUN_SUMMARY_MAX:
                    return JSONResponse(
                        {
                            "message": f"Only {CHECK_RUN_SUMMARY_MAX} characters are allowed; "
                            f"{len(output['summary'])} were supplied."
                        },
                        status_code=422,
                    )
            if body.get("status") == "completed" and "conclusion" not in body:
                return JSONResponse(
                    {"message": "conclusion is required when status is completed"}, status_code=422
                )
            return None

        def shown_check_run(check_run_id: int) -> dict[str, Any]:
            return {"id": check_run_id, **self.check_runs[check_run_id]}

        @app.post("/repos/{owner}/{name}/check-runs")
        async def create_check_run(owner: str, name: str, request: Request) -> Response:
            if (refused := refuse(request)) is not None:
                return refused
            body = await request.json()
            if (error := check_run_error(repo_path(owner, name), body, creating=True)) is not None:
                return error
            check_run_id = 1000 + len(self.check_runs) + 1
            state = {k: v for k, v in body.items() if k != "head_sha"}
            # A conclusion completes the check run, as on GitHub.
            status = "completed" if "conclusion" in body else body.get("status", "queued")
            self.check_runs[check_run_id] = {
                **state,
                "repo": f"{owner}/{name}",
                "head_sha": body["head_sha"],
                "status": status,
                "conclusion": body.get("conclusion"),
            }
            self.check_run_requests.append(CheckRunRequest("POST", f"{owner}/{name}", check_run_id, body))
            return JSONResponse(shown_check_run(check_run_id), status_code=201)

        @app.patch("/repos/{owner}/{name}/check-runs/{check_run_id}")
        async def update_check_run(owner: str, name: str, check_run_id: int, request: Request) -> Response:
            if (refused := refuse(request)) is not None:
                return refused
            body = await request.json()
            found = self.check_runs.get(check_run_id)
            if found is None or found["repo"] != f"{owner}/{name}":
                return JSONResponse({"message": "Not Found"}, status_code=404)
            if (error := check_run_error(repo_path(owner, name), body, creating=False)) is not None:
                return error
            found.update(body)
            if "conclusion" in body:
                found["status"] = "completed"
            self.check_run_requests.append(CheckRunRequest("PATCH", f"{owner}/{name}", check_run_id, body))
            return JSONResponse(shown_check_run(check_run_id))

        @app.get("/repos/{owner}/{name}/check-runs/{check_run_id}")
        def get_check_run(owner: str, name: str, check_run_id: int, request: Request) -> Response:
            if (refused := refuse(request)) is not None:
                return refused
            found = self.check_runs.get(check_run_id)
            if found is None or found["repo"] != f"{owner}/{name}":
                return JSONResponse({"message": "Not Found"}, status_code=404)
            return JSONResponse(shown_check_run(check_run_id))

        return app

    def __enter__(self) -> FakeGitHub:
        config = uvicorn.Config(
            self.app(), host="127.0.0.1", port=self.port, log_level="warning", lifespan="off"
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, daemon=True)
        self._thread.start()
        wait_until(lambda: self._server.started, timeout=10, what="fake GitHub to start")
        return self

    def __exit__(self, *_: object) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)

    def statuses_for(self, sha: str) -> list[RecordedStatus]:
        """Statuses received for one commit, in order."""
        return [s for s in self.statuses if s.sha == sha]


def push_payload(
    repo_name: str, repo: Path, *, ref: str, before: str, after: str, default_branch: str = "main"
) -> dict[str, Any]:
    """A GitHub `push` payload for commits `before..after` of a real repository."""
    commits = []
    revs = (
        git(repo, "rev-list", "--reverse", f"{before}..{after}").split() if set(before) != {"0"} else [after]
    )
    for rev in revs:
        message = git(repo, "log", "-1", "--format=%B", rev).strip()
        changed = git(repo, "show", "--name-status", "--format=", rev).splitlines()
        added = [line.split("\t", 1)[1] for line in changed if line.startswith("A")]
        modified = [line.split("\t", 1)[1] for line in changed if line.startswith("M")]
        removed = [line.split("\t", 1)[1] for line in changed if line.startswith("D")]
        commits.append(
            {"id": rev, "message": message, "added": added, "modified": modified, "removed": removed}
        )
    return {
        "ref": ref,
        "before": before,
        "after": after,
        "repository": {"full_name": repo_name, "default_branch": default_branch},
        "sender": {"login": "octocat"},
        "head_commit": commits[-1] if commits else None,
        "commits": commits,
    }


def post_webhook(
    url: str,
    secret: str | None,
    event: str,
    payload: dict[str, Any],
    delivery: str | None = None,
    *,
    signature: str | None = None,
) -> httpx.Response:
    """POST a webhook as GitHub does (signature over the exact bytes sent)."""
    import json

    body = json.dumps(payload).encode()
    headers = {
        "Content-Type": "application/json",
        "X-GitHub-Event": event,
        "X-GitHub-Delivery": delivery or str(uuid.uuid4()),
        "User-Agent": "GitHub-Hookshot/fake",
    }
    if signature is not None:
        headers["X-Hub-Signature-256"] = signature
    elif secret is not None:
        headers["X-Hub-Signature-256"] = github_signature(secret, body)
    return HTTP.post(url, content=body, headers=headers, timeout=30)
