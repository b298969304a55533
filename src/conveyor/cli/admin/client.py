"""The admin HTTP client and the CLI's output and error conventions (docs/design/admin.md §7).

Exit codes: 0 ok, 1 API or server error, 2 usage or bad input, 3 for 401/403, 4 for 404, 5 a run the
command waited on did not succeed (`run logs --follow`, `source trigger-local`). Errors print
`error: <detail> (<code>, HTTP <status>)` on stderr, never a traceback.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer

if TYPE_CHECKING:
    import httpx

DEFAULT_URL = "http://127.0.0.1:8470"
API_PREFIX = "/api/v1/admin"
# Every admin command's `--json`: print the API body as is, for scripts.
JsonFlag = Annotated[bool, typer.Option("--json", help="Print the API body as is.")]
# The paging options every list command spells the same way.
LimitOption = Annotated[int, typer.Option("--limit", help="Rows per page.")]
AllPagesOption = Annotated[bool, typer.Option("--all", help="Follow every page.")]
CursorOption = Annotated[
    str | None, typer.Option("--cursor", help="The page after this cursor (a list's `next`).")
]

EXIT_API = 1
EXIT_USAGE = 2
EXIT_AUTH = 3
EXIT_NOT_FOUND = 4
EXIT_RUN_NOT_SUCCESSFUL = 5


def error_exit_code(status: int) -> int:
    """The exit code of an API error answer: 3 for 401/403, 4 for 404, 2 for refused input, else 1."""
    if status in (401, 403):
        return EXIT_AUTH
    if status == 404:
        return EXIT_NOT_FOUND
    if status in (400, 413, 416, 422):
        return EXIT_USAGE
    return EXIT_API


def fail(message: str, code: int) -> NoReturn:
    """Print one line on stderr and exit with `code`."""
    sys.stderr.write(f"error: {message}\n")
    raise typer.Exit(code)


_TITLE = re.compile(r"<title[^>]*>(.*?)</title>", re.IGNORECASE | re.DOTALL)


def not_conveyor_answer(url: str, status: int, headers: Mapping[str, str], text: str) -> str:
    """One line for an answer that is not a Conveyor's: the status, the content type, the `Server`
    header and an HTML page's title, never the page itself."""
    parts = [f"HTTP {status}"]
    content_type = (headers.get("content-type") or "").split(";", 1)[0].strip()
    parts.append(content_type or "no content type")
    server = " ".join((headers.get("server") or "").split())[:60]
    if server:
        parts.append(f"server {server!r}")
    title = _TITLE.search(text[:65_536])
    if title and title.group(1).strip():
        parts.append(f"page {' '.join(title.group(1).split())[:80]!r}")
    return (
        f"{url} is not a Conveyor admin API (it answered {', '.join(parts)}); "
        "check --url or CONVEYOR_URL (a Conveyor answers JSON, e.g. http://127.0.0.1:8470)"
    )


@dataclass
class AdminOptions:
    """Options of the `conveyor admin` group, shared by every verb."""

    url: str = DEFAULT_URL
    token: str | None = None
    json_output: bool = False
    timeout: float = 30.0


class AdminClient:
    """Calls the admin API and turns every failure into the CLI's error line and exit code."""

    def __init__(self, options: AdminOptions) -> None:
        self.options = options

    def _headers(self) -> dict[str, str]:
        if not self.options.token:
            fail("no admin token: pass --token or set CONVEYOR_TOKEN", EXIT_AUTH)
        from conveyor.version import VERSION

        return {"Authorization": f"Bearer {self.options.token}", "User-Agent": f"conveyor-cli/{VERSION}"}

    def request(
        self,
        method: str,
        path: str,
        *,
        json_body: Any = None,
        params: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
        answers: frozenset[int] = frozenset(),
        prefix: str = API_PREFIX,
    ) -> Any:
        """Send one request under `prefix` (the admin API's); return the decoded JSON (None for 204).

        `answers`: error statuses whose body the caller reads itself instead of failing (e.g. a 409
        that asks for a confirmation). Anything but a Conveyor's JSON answer (another web server at
        `--url`) fails with one line naming what answered.
        """
        url = self.options.url.rstrip("/") + prefix + path
        clean_params = {k: v for k, v in (params or {}).items() if v is not None}
        import httpx  # here, not at the top: every `conveyor` call would pay for it (a fast CLI)

        try:
            response = httpx.request(
                method,
                url,
                json=json_body,
                params=clean_params,
                headers={**self._headers(), **(headers or {})},
                timeout=self.options.timeout,
            )
        except httpx.HTTPError as exc:
            fail(f"cannot reach {self.options.url}: {exc}", EXIT_API)
        if response.status_code == 204:
            return None
        try:
            body = response.json()
        except ValueError:
            body = None
        conveyor_error = isinstance(body, dict) and "error" in body
        if body is not None and (response.is_success or (response.status_code in answers and conveyor_error)):
            return body
        self._fail_answer(response, body)

    def _fail_answer(self, response: httpx.Response, body: Any) -> NoReturn:
        """Fail on an answer that is not what the caller can use: a Conveyor's error (its detail and
        code, the exit code by status), or one line naming whatever else answered at `--url`."""
        if not (isinstance(body, dict) and "error" in body):
            fail(
                not_conveyor_answer(self.options.url, response.status_code, response.headers, response.text),
                EXIT_API,
            )
        fail(
            f"{body.get('detail', '')} ({body['error']}, HTTP {response.status_code})",
            error_exit_code(response.status_code),
        )

    @contextmanager
    def stream(
        self, path: str, *, prefix: str = API_PREFIX, method: str = "GET", json_body: Any = None
    ) -> Iterator[httpx.Response]:
        """Send `method` to `prefix+path` (a GET unless told) and yield the answer with its body unread (a
        download); an error answer fails as `request` does, before anything is yielded.

        Errors while the caller reads the body (`httpx.HTTPError`) are the caller's to handle: it
        knows what it wrote and must undo.
        """
        import httpx

        url = self.options.url.rstrip("/") + prefix + path
        with httpx.Client(timeout=self.options.timeout) as session:
            try:
                response = session.send(
                    session.build_request(method, url, headers=self._headers(), json=json_body), stream=True
                )
            except httpx.HTTPError as exc:
                fail(f"cannot reach {self.options.url}: {exc}", EXIT_API)
            try:
                if not response.is_success:
                    try:
                        response.read()
                        body = response.json()
                    except (httpx.HTTPError, ValueError):
                        body = None
                    self._fail_answer(response, body)
                yield response
            finally:
                response.close()

    def get(self, path: str, **params: Any) -> Any:
        """GET with query parameters."""
        return self.request("GET", path, params=params)

    def try_get(self, path: str, **params: Any) -> Any:
        """GET that answers None instead of failing when the token may not read it (403)."""
        url = self.options.url.rstrip("/") + API_PREFIX + path
        import httpx

        try:
            response = httpx.get(url, params=params, headers=self._headers(), timeout=self.options.timeout)
        except httpx.HTTPError:
            return None
        try:
            return response.json() if response.is_success else None
        except ValueError:
            return None

    def paged(self, path: str, *, follow: bool, cursor: str | None = None, **params: Any) -> dict[str, Any]:
        """GET a list from `cursor` (the start when None); with `follow`, walk every cursor and merge the items."""
        page = self.get(path, **params, **({"cursor": cursor} if cursor else {}))
        items = list(page.get("items", []))
        while follow and page.get("next_cursor"):
            page = self.get(path, **{**params, "cursor": page["next_cursor"]})
            items.extend(page.get("items", []))
        return {"items": items, "next_cursor": None if follow else page.get("next_cursor")}


def options_from(ctx: typer.Context) -> AdminOptions:
    """The admin group's options (set by its callback)."""
    obj = ctx.find_root().obj
    return (
        obj
        if isinstance(obj, AdminOptions)
        else AdminOptions(
            url=os.environ.get("CONVEYOR_URL", DEFAULT_URL), token=os.environ.get("CONVEYOR_TOKEN")
        )
    )


def client_from(ctx: typer.Context, json_output: bool = False) -> AdminClient:
    """A client for this invocation; `json_output` from the verb's own `--json` flag."""
    options = options_from(ctx)
    if json_output:
        options.json_output = True
    return AdminClient(options)


def print_json(value: Any) -> None:
    """The API body as is."""
    sys.stdout.write(json.dumps(value, indent=2, sort_keys=False, default=str) + "\n")


def plain_table(rows: Iterable[dict[str, Any]], columns: Sequence[str], title: str | None = None) -> str:
    """Whole values in aligned columns, for output that is not a terminal (pipes, scripts, logs)."""
    cells = [list(columns)] + [
        ["" if row.get(c) is None else str(row.get(c)) for c in columns] for row in rows
    ]
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    lines = [
        "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
        for line in cells
    ]
    return "\n".join(([title] if title else []) + lines) + "\n"


def print_table(rows: Iterable[dict[str, Any]], columns: Sequence[str], title: str | None = None) -> None:
    """A rich table of the given columns on a terminal; whole values in plain columns otherwise."""
    if not sys.stdout.isatty():
        sys.stdout.write(plain_table(rows, columns, title))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for column in columns:
        table.add_column(column)
    for row in rows:
        table.add_row(*("" if row.get(c) is None else str(row.get(c)) for c in columns))
    Console().print(table)


def print_next(client: AdminClient, page: dict[str, Any]) -> None:
    """After a list's table: where the next page starts, if there is one (nothing with `--json`)."""
    if page.get("next_cursor") and not client.options.json_output:
        typer.echo(f"next: --cursor {page['next_cursor']} (or --all for every page)")


def print_fields(row: dict[str, Any]) -> None:
    """`key: value` lines of one resource."""
    width = max((len(k) for k in row), default=0)
    for key, value in row.items():
        shown = json.dumps(value, default=str) if isinstance(value, dict | list) else value
        sys.stdout.write(f"{key.ljust(width)}  {'' if shown is None else shown}\n")
