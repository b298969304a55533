"""A Chromium browser driven by Playwright, signed in to a dashboard, and the screenshots kept of a test."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, expect, sync_playwright

from tests.support.dispatch_stage import Stage

REPO_ROOT = Path(__file__).resolve().parents[2]


def _artifacts() -> Path:
    base = Path(os.environ.get("CONVEYOR_TEST_ARTIFACTS") or REPO_ROOT / "test-artifacts")
    target = base / "dashboard"
    target.mkdir(parents=True, exist_ok=True)
    return target


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    executable = os.environ.get("CONVEYOR_TEST_CHROMIUM") or shutil.which("chromium")
    assert executable, "chromium is not installed: `make test` installs it (apt-get install chromium)"
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(
            executable_path=executable, headless=True, args=["--no-sandbox"]
        )
        try:
            yield launched
        finally:
            launched.close()


def _sign_in(page: Page, s: Stage, path: str, token: str | None = None) -> None:
    page.goto(s.server.url + path)
    expect(page).to_have_url(f"{s.server.url}/ui/sign-in?next={path.replace('/', '%2F')}")
    page.fill("input[name=token]", token or s.token)
    page.click("button[type=submit]")
    expect(page).to_have_url(s.server.url + path)
