"""Forgetting a worker through the admin API and reading the outcome of its jobs."""

from __future__ import annotations

import httpx

FORGET = "/api/v1/admin/peers/forget"


def outcomes(answer: httpx.Response) -> list[tuple[str, str]]:
    return [(r["coordinator"], r["outcome"]) for r in answer.json()["results"]]
