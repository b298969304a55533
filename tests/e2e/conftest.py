"""Fixtures of the end-to-end tests: the Chromium browser the dashboard tests drive."""

from tests.support.browser import browser  # noqa: F401 (a fixture, registered for this folder)
