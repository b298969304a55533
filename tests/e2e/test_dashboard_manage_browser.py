""" "Run workflow" and the secrets page in a real browser (Debian's chromium through Playwright, issue 42).

One walk covers the acceptance: a secret set from the page is used by the next run and its value appears
in no page; "Run workflow" shows the API's error for a bad input, then starts a run with the inputs typed;
an auditor sees no management button or form, and a forced POST gets 403 and changes nothing.
Screenshots land in `test-artifacts/dashboard/` (or `$CONVEYOR_TEST_ARTIFACTS/dashboard/`).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.support.agents import agent_process
from tests.support.browser import _artifacts, _sign_in
from tests.support.dispatch_stage import stage

pytestmark = pytest.mark.slow


SECRET_VALUE = "pa55-marker-90417"


def _deploy(out: Path) -> str:
    # The step writes the secret where the test can read it (the log masks it), and prints its inputs.
    return f"""
from pathlib import Path

from conveyor import Input, dispatch, workflow

deploy = workflow("deploy", on=[dispatch(inputs={{"target": Input(str, required=True), "count": Input(int, default=1)}})])

@deploy.job(runs_on=["linux"])
def ship(ctx):
    token = ctx.secrets.get("DEPLOY_TOKEN")
    Path({str(out)!r}).write_text(token)
    print("shipping to", ctx.inputs["target"], "x", ctx.inputs["count"], "with", token)
"""


def _no_secret_in(page: Page) -> None:
    assert SECRET_VALUE not in page.content(), page.url
    assert SECRET_VALUE not in page.url


def test_run_workflow_with_a_secret_set_from_the_page_and_an_auditor_without_management(
    browser: Browser, tmp_path: Path
) -> None:
    out = tmp_path / "used-secret.txt"
    with stage(tmp_path, "", {"deploy": _deploy(out)}) as s:
        context = browser.new_context()
        page = context.new_page()
        _sign_in(page, s, "/ui/secrets")
        form = page.locator("form#set-secret")
        form.locator("input[name=name]").fill("DEPLOY_TOKEN")
        form.locator("input[name=value]").fill(SECRET_VALUE)
        form.locator("button[type=submit]").click()
        expect(page.locator("p.notice")).to_have_text("secret DEPLOY_TOKEN created in scope org")
        expect(page.locator("tr[data-secret='org/DEPLOY_TOKEN']")).to_have_count(1)
        _no_secret_in(page)
        page.screenshot(path=str(_artifacts() / "secrets.png"), full_page=True)

        page.goto(s.server.url + "/ui/sources")
        page.locator(f"tr[data-source-id='{s.source_id}'] a").click()
        page.locator("tr[data-workflow='deploy'] a").click()
        expect(page).to_have_url(f"{s.server.url}/ui/sources/{s.source_id}/workflows/deploy")
        run_form = page.locator("form#run-workflow")
        expect(run_form.locator("input[name='input.count']")).to_have_value("1")
        # A bad value is refused with the API's sentence, and nothing typed is lost.
        run_form.locator("input[name='input.count']").fill("many")
        run_form.locator("button[type=submit]").click()
        expect(page.locator("#run-refused")).to_contain_text("target: is required")
        expect(page.locator("#run-refused")).to_contain_text("count: cannot parse 'many'")
        expect(page.locator("form#run-workflow input[name='input.count']")).to_have_value("many")
        page.screenshot(path=str(_artifacts() / "run-workflow-refused.png"), full_page=True)
        assert s.api("GET", "/runs").json()["items"] == []

        run_form = page.locator("form#run-workflow")
        run_form.locator("input[name='input.target']").fill("staging")
        run_form.locator("input[name='input.count']").fill("2")
        with agent_process(s, tmp_path / "agent-home"):
            run_form.locator("button[type=submit]").click()
            expect(page.locator("p.notice")).to_contain_text("started: deploy by hand")
            run_id = page.url.split("/ui/runs/", 1)[1].split("?", 1)[0]
            expect(page.locator(f"[data-status-of='run:{run_id}']").first).to_have_text(
                "success", timeout=120_000
            )
        assert out.read_text() == SECRET_VALUE, "the run did not get the secret set from the page"
        assert s.run(run_id)["event"]["payload"]["inputs"] == {"target": "staging", "count": 2}
        page.reload()
        expect(page.locator("div.log").filter(has_text="shipping to staging x 2 with ***")).to_have_count(1)
        _no_secret_in(page)
        page.screenshot(path=str(_artifacts() / "run-workflow-started.png"), full_page=True)
        for path in ("/ui/secrets", "/ui/sources", f"/ui/sources/{s.source_id}/workflows/deploy", "/ui/runs"):
            page.goto(s.server.url + path)
            _no_secret_in(page)
        context.close()

        auditor_token = s.api("POST", "/tokens", json={"role": "auditor", "label": "auditor"}).json()["token"]
        watcher = browser.new_context()
        audit = watcher.new_page()
        _sign_in(audit, s, f"/ui/sources/{s.source_id}/workflows/deploy", auditor_token)
        expect(audit.locator("#run-not-allowed")).to_have_count(1)
        for path in (
            f"/ui/sources/{s.source_id}/workflows/deploy",
            "/ui/secrets",
            f"/ui/runs/{run_id}",
            "/ui/agents",
        ):
            audit.goto(s.server.url + path)
            # The only form that posts is "Sign out": no management button or form at all.
            expect(audit.locator("form[method=post]")).to_have_count(1)
            expect(audit.locator("form[method=post]")).to_have_attribute("action", "/ui/sign-out")
        expect(audit.locator("h1")).to_have_text("Agents")
        audit.goto(s.server.url + "/ui/secrets")
        audit.screenshot(path=str(_artifacts() / "secrets-auditor.png"), full_page=True)
        csrf = audit.locator("form[action='/ui/sign-out'] input[name=csrf_token]").input_value()
        forced = audit.request.post(
            s.server.url + "/ui/secrets/set",
            form={"csrf_token": csrf, "scope": "org", "name": "DEPLOY_TOKEN", "value": "overwritten"},
        )
        assert forced.status == 403 and "secret.write" in forced.text()
        started = audit.request.post(
            s.server.url + f"/ui/sources/{s.source_id}/workflows/deploy/run",
            form={"csrf_token": csrf, "input.target": "prod"},
        )
        assert started.status == 403 and "source.trigger" in started.text()
        watcher.close()
        assert [r["id"] for r in s.api("GET", "/runs").json()["items"]] == [run_id]
        [secret] = s.api("GET", "/secrets").json()["items"]
        assert secret["updated_at"] == secret["created_at"], "the forced POST changed the secret"
