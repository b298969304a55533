"""The log viewer in a real browser (Debian's chromium driven by Playwright against a real server process
whose local scaler spawns a real agent).

A job prints coloured lines and a `<script>` line, waits, then fails in its next step: while it runs the
streamed lines are coloured (not escapes) and the script is text; once it failed, the reloaded page opens the
failing step, folds setup's git lines, finds a line by search, shows times on demand, opens the step of a
linked line and downloads the raw log. The page's ANSI renderer (app.js) gives, for every vector of
tests/unit/dashboard/ansi_vectors.json, the HTML the server's renderer gives.
Screenshots land in `test-artifacts/dashboard/` (or `$CONVEYOR_TEST_ARTIFACTS/dashboard/`).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.support.browser import _artifacts, _sign_in
from tests.support.dispatch_stage import stage
from tests.support.scaler_e2e import kill_leftover_agents, scaler_env, scalers_yaml

pytestmark = pytest.mark.slow

SCRIPT_LINE = re.compile(r"^<script>alert\(1\)</script>$")  # the line itself, not the echoed command
VECTORS = json.loads((Path(__file__).parents[1] / "unit" / "dashboard" / "ansi_vectors.json").read_text())


def _workflow(gate: Path) -> str:
    # The markers and escapes are computed by the shell, so the echoed command lines contain neither.
    colours = (
        "e=$(printf '\\033'); "
        'printf \'%s[3%dm%s%s[0m plain\\n\' "$e" 1 red$((1+1)) "$e"; '
        'printf \'%s[38;2;10;%d;30m%s%s[0m\\n\' "$e" 200 true$((2+3)) "$e"; '
        "echo '<script>alert(1)</script>'; "
        "i=0; while [ $i -lt 120 ]; do echo filler $i; i=$((i+1)); done; "
        "echo started $((40+2)); "
        f"while [ ! -e {gate} ]; do sleep 0.05; done"
    )
    return f"""
from conveyor import push, workflow

ci = workflow("ci", on=[push(branches=["main"])])
build = ci.job("build", runs_on=["linux"])


@build.step
def colours(ctx):
    ctx.sh(["sh", "-c", {colours!r}])


@build.step
def tests(ctx):
    ctx.sh(["sh", "-c", "echo needle $((4000+242)); exit 3"])
"""


def _colour(page: Page, selector: str) -> str:
    return str(page.eval_on_selector(selector, "el => getComputedStyle(el).color"))


def _step_of(page: Page, text: str) -> str:
    """The `data-step` of the step whose log holds a line with `text`."""
    return str(
        page.evaluate(
            """text => [...document.querySelectorAll('details[data-step]')]
                .find(d => [...d.querySelectorAll('.log .tx')].some(t => t.textContent === text)).dataset.step""",
            text,
        )
    )


def _is_open(page: Page, step: str) -> bool:
    return bool(page.evaluate('s => document.querySelector(`details[data-step="${s}"]`).open', step))


def test_the_log_viewer_colours_escapes_searches_and_opens_the_failing_step(
    browser: Browser,
    tmp_path: Path,
) -> None:
    gate = tmp_path / "gate"
    (tmp_path / "scalers.yaml").write_text(scalers_yaml())
    dialogs: list[str] = []
    with stage(tmp_path, "", {"ci": _workflow(gate)}, env=scaler_env(tmp_path)) as s:
        try:
            run_id = s.push()
            context = browser.new_context(accept_downloads=True)
            page = context.new_page()
            page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
            _sign_in(page, s, f"/ui/runs/{run_id}")

            # Live: streamed lines are rendered by app.js.
            expect(page.locator(".log .line .tx", has_text="started 42")).to_have_count(1, timeout=60_000)
            red = page.locator(".log span.ansi-fg-1", has_text="red2")
            expect(red).to_have_count(1)
            assert _colour(page, ".log span.ansi-fg-1") == "rgb(224, 108, 117)"
            expect(page.locator('.log span[data-fg="#0ac81e"]')).to_have_text("true5")
            assert _colour(page, '.log span[data-fg="#0ac81e"]') == "rgb(10, 200, 30)"
            logs_text = page.locator("section.job").inner_text()
            assert "[31m" not in logs_text and "\x1b" not in logs_text
            expect(page.locator(".log .tx").filter(has_text=SCRIPT_LINE)).to_have_count(1)
            assert page.locator(".log script").count() == 0
            page.screenshot(path=str(_artifacts() / "log-live.png"), full_page=True)

            gate.touch()
            expect(page.locator(f"[data-status-of='run:{run_id}']").first).to_have_text(
                "failed", timeout=60_000
            )

            # Reloaded: the server renders the finished job's log the same way.
            page.reload()
            failing, coloured = _step_of(page, "needle 4242"), _step_of(page, "red2 plain")
            assert _is_open(page, failing) and not _is_open(page, coloured)
            assert _colour(page, ".log span.ansi-fg-1") == "rgb(224, 108, 117)"
            assert _colour(page, '.log span[data-fg="#0ac81e"]') == "rgb(10, 200, 30)"
            assert "[31m" not in page.locator("section.job").text_content()  # hidden steps included
            assert page.locator(".log script").count() == 0
            assert page.locator(".log .tx").filter(has_text=SCRIPT_LINE).count() == 1
            # Setup's git lines are folded, and the fold is closed.
            fold = page.locator(".log[data-setup] details.fold").first
            assert fold.evaluate("f => !f.open && f.textContent.includes('$ git ')")
            page.screenshot(path=str(_artifacts() / "log-failed.png"), full_page=True)

            # Search: a line in a closed step is found, highlighted and shown; Enter moves on.
            search = page.locator("[data-log-search]")
            search.fill("filler 117")
            current = page.locator(".log .line.current")
            expect(current).to_have_count(1)
            expect(current.locator(".tx")).to_have_text("filler 117")
            expect(current).to_be_visible()
            expect(page.locator("[data-log-hits]")).to_have_text("1 / 1")
            assert _is_open(page, coloured)
            search.fill("filler 11")  # filler 11, 110 … 119
            expect(page.locator("[data-log-hits]")).to_have_text("1 / 11")
            search.press("Enter")
            expect(page.locator("[data-log-hits]")).to_have_text("2 / 11")
            expect(current.locator(".tx")).to_have_text("filler 110")
            search.press("Shift+Enter")
            search.press("Shift+Enter")
            expect(page.locator("[data-log-hits]")).to_have_text("11 / 11")
            page.screenshot(path=str(_artifacts() / "log-search.png"), full_page=True)
            search.fill("no such line anywhere")
            expect(page.locator("[data-log-hits]")).to_have_text("no match")

            # Times on demand.
            first_time = page.locator(f'details[data-step="{failing}"] .log .ts').first
            expect(first_time).to_be_hidden()
            page.check("[data-log-times]")
            expect(first_time).to_be_visible()
            assert re.fullmatch(r"\d\d:\d\d:\d\d\.\d{3}", first_time.inner_text())
            page.screenshot(path=str(_artifacts() / "log-timestamps.png"), full_page=True)

            # A line's link opens its step when followed.
            anchor = page.locator(".log .line", has=page.locator(".tx", has_text="filler 5")).first
            line_id = anchor.get_attribute("id")
            assert line_id and anchor.locator("a.ln").get_attribute("href") == f"#{line_id}"
            page.goto(f"{s.server.url}/ui/runs/{run_id}#{line_id}")
            page.reload()
            expect(page.locator(f"[id='{line_id}']")).to_be_visible()
            assert _is_open(page, coloured)

            # The raw log downloads as text, escapes and all.
            with page.expect_download() as started:
                page.click("[data-log-raw]")
            download = started.value
            assert download.failure() is None and download.suggested_filename.endswith("-build.log")
            raw = Path(download.path()).read_text()
            assert "\x1b[31mred2\x1b[0m plain" in raw and "needle 4242" in raw
            assert dialogs == []
            context.close()
        finally:
            s.server.stop()
            kill_leftover_agents(tmp_path)


def test_the_page_s_ansi_renderer_matches_the_server_s_on_every_vector(
    browser: Browser,
    tmp_path: Path,
) -> None:
    with stage(tmp_path, "", {}) as s:
        page = browser.new_page()
        page.goto(s.server.url + "/ui/sign-in")
        page.wait_for_function("typeof renderAnsiInto === 'function'")
        rendered = page.evaluate(
            """vectors => vectors.map(v => {
                const holder = document.createElement('div');
                renderAnsiInto(holder, v.input);
                return holder.innerHTML;
            })""",
            VECTORS,
        )
        mismatches = [
            (v["name"], got, v["html"]) for v, got in zip(VECTORS, rendered, strict=True) if got != v["html"]
        ]
        assert mismatches == []
        page.close()
