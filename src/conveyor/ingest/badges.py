"""`GET /badge/{source}/{workflow}.svg`: a workflow's status badge, for sources whose badges are public
(docs/design/execution.md §11). No token: the source's `public_badges` is the permission."""

from __future__ import annotations

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response

from conveyor.execution import store as execution_store
from conveyor.http import database
from conveyor.ingest import store
from conveyor.ingest.badge_svg import badge_status, render_badge
from conveyor.model.errors import ApiError

router = APIRouter()

# Short: a README's badge follows the branch within a minute, and so does a source turned private.
CACHE_CONTROL = "max-age=60"
# The image is opened directly too (a browser's "open image"): no script, no fetch, even if one got in.
SVG_HEADERS = {
    "Cache-Control": CACHE_CONTROL,
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'",
    "X-Content-Type-Options": "nosniff",
}


def no_such_badge() -> ApiError:
    """The one answer for an unknown source and a private one, so a badge reveals neither."""
    return ApiError(404, "not_found", "no such badge")


# `source:path`: a source's name may hold `/` (`acme/app`); the last segment is the workflow.
@router.get("/badge/{source:path}/{workflow}.svg", include_in_schema=False)
async def status_badge(
    source: str,
    workflow: str,
    request: Request,
    ref: str | None = Query(default=None, max_length=500),
) -> Response:
    """The SVG of the workflow's newest finished run on `ref` (default: the source's default branch)."""
    async with database(request).read() as conn:
        found = await store.find_public_source(conn, source)
        if found is None:
            raise no_such_badge()
        # A source without a default branch: the newest finished run on any ref.
        on_ref = ref or found.default_branch or None
        run = await execution_store.latest_finished_run(
            conn, source_id=found.id, workflow=workflow, ref=on_ref
        )
    status = badge_status(run["status"], run["reason"]) if run else badge_status(None)
    return Response(render_badge(workflow, status), media_type="image/svg+xml", headers=SVG_HEADERS)
