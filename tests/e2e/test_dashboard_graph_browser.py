"""The run page's job graph in a real browser (Debian's chromium through Playwright, issue 42).

A three-job diamond (a → b, a → c, b and c → d) runs on a real agent: the page draws four boxes and four
arrows, and the boxes turn `success` as the jobs end, without a reload. The header fits a 390 px phone.
Screenshots land in `test-artifacts/dashboard/` (or `$CONVEYOR_TEST_ARTIFACTS/dashboard/`).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from playwright.sync_api import Browser, expect

from tests.support.agents import agent_process
from tests.support.browser import _artifacts, _sign_in
from tests.support.dispatch_stage import stage

pytestmark = pytest.mark.slow


def _diamond(gate: Path) -> str:
    # `a` waits for the test's gate so the page is watched while the graph is still pending.
    return f"""
from conveyor import push, workflow

ci = workflow("ci", on=[push(branches=["main"])])

@ci.job(runs_on=["linux"])
def a(ctx):
    ctx.sh(["sh", "-c", "while [ ! -e {gate} ]; do sleep 0.05; done"])

@ci.job(runs_on=["linux"], needs=[a])
def b(ctx):
    ctx.sh(["true"])

@ci.job(runs_on=["linux"], needs=[a])
def c(ctx):
    ctx.sh(["true"])

@ci.job(runs_on=["linux"], needs=[b, c])
def d(ctx):
    ctx.sh(["true"])
"""


def test_a_diamond_is_drawn_as_four_boxes_and_four_arrows_that_go_green_live(
    browser: Browser, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    with stage(tmp_path, "", {"ci": _diamond(gate)}) as s:
        with agent_process(s, tmp_path / "agent-home"):
            run_id = s.push()
            jobs = {job["name"]: job["id"] for job in s.run(run_id)["jobs"]}
            assert sorted(jobs) == ["a", "b", "c", "d"]
            context = browser.new_context()
            page = context.new_page()
            _sign_in(page, s, f"/ui/runs/{run_id}")
            page.evaluate("window.__sameDocument = true")
            graph = page.locator("svg.graph")
            expect(graph.locator("a.gnode")).to_have_count(4)
            expect(graph.locator("path.gedge")).to_have_count(4)
            edges = sorted(graph.locator("path.gedge").evaluate_all("els => els.map(e => e.dataset.edge)"))
            assert edges == sorted(
                f"{jobs[x]}:{jobs[y]}" for x, y in (("a", "b"), ("a", "c"), ("b", "d"), ("c", "d"))
            )
            # Columns by the longest chain: a, then b and c one above the other, then d.
            boxes = {
                name: graph.locator(f"a.gnode[data-node-of='{job_id}'] rect").bounding_box()
                for name, job_id in jobs.items()
            }
            assert all(box is not None for box in boxes.values())
            xs = {name: box["x"] for name, box in boxes.items() if box}
            assert xs["a"] < xs["b"] == xs["c"] < xs["d"]
            d_status = graph.locator(f"[data-status-of='job:{jobs['d']}']")
            expect(d_status).not_to_have_text("success")
            page.screenshot(path=str(_artifacts() / "run-graph-running.png"), full_page=True)

            gate.touch()
            for job_id in jobs.values():
                expect(graph.locator(f"[data-status-of='job:{job_id}']")).to_have_text(
                    "success", timeout=90_000
                )
            expect(d_status).to_have_class("gstatus s-success")
            assert page.evaluate("window.__sameDocument === true"), "the page reloaded"
            page.screenshot(path=str(_artifacts() / "run-graph.png"), full_page=True)
            # "Why did this run?" reads as the CLI's lines; the JSON is behind a toggle.
            expect(page.locator("#trace-lines")).to_contain_text("MATCHED  ci  (trigger 0)")
            expect(page.locator("details.raw-trace pre")).not_to_be_visible()
            context.close()

            phone = browser.new_context(viewport={"width": 390, "height": 844})
            small = phone.new_page()
            _sign_in(small, s, "/ui/runs")
            width = small.evaluate("document.documentElement.scrollWidth")
            assert width <= 390, f"the runs page is {width} px wide at 390 px"
            for link in small.locator("header.top nav a").all():
                box = link.bounding_box()
                assert box is not None and box["x"] + box["width"] <= 390 and box["y"] < 200
            sign_out = small.locator("header.top button[type=submit]").bounding_box()
            assert sign_out is not None and sign_out["x"] + sign_out["width"] <= 390
            small.screenshot(path=str(_artifacts() / "runs-390px.png"), full_page=True)
            phone.close()
