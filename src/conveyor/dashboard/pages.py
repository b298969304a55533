"""What every dashboard page shares: the templates, the session of a request, rendering and error pages,
CSRF-checked forms, keyset-paginated lists, and actions that go through the admin API and come back with a
notice."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any
from urllib.parse import quote, urlencode

from fastapi import Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from jinja2 import Environment, PackageLoader, select_autoescape
from starlette.datastructures import FormData

from conveyor.dashboard.api import ApiAnswer, call_api
from conveyor.dashboard.service import DashboardSessions, Session
from conveyor.dashboard.sessions import COOKIE_NAME, CSRF_FIELD, csrf_matches, origin_allowed
from conveyor.dashboard.views import can_rerun_failed, exact_time, relative_time
from conveyor.model.caches import step_cache_text
from conveyor.model.durations import duration_text
from conveyor.model.ids import utc_now
from conveyor.model.permissions import role_allows
from conveyor.model.sizes import size_text

env = Environment(
    loader=PackageLoader("conveyor.dashboard", "templates"),
    autoescape=select_autoescape(default=True, default_for_string=True),
    trim_blocks=True,
    lstrip_blocks=True,
)
env.globals["duration"] = duration_text
env.globals["can_rerun_failed"] = can_rerun_failed
env.filters["size"] = size_text
env.filters["ago"] = lambda value: relative_time(value, utc_now())
env.filters["exact_time"] = exact_time
env.filters["step_cache"] = step_cache_text
env.filters["urlquote"] = lambda value: quote(str(value), safe="")
# Plain JSON text; autoescaping makes it safe in HTML (`tojson` would show quotes as \u0027).
env.filters["pretty"] = lambda value, indent=2: json.dumps(
    value, indent=indent or None, ensure_ascii=False, default=str, sort_keys=True
)


def sessions_service(request: Request) -> DashboardSessions:
    """The app's dashboard sessions."""
    service: DashboardSessions = request.app.state.dashboard
    return service


def remote_of(request: Request) -> str:
    """The caller's address (the sign-in throttle's key)."""
    return request.client.host if request.client else "unknown"


async def session_of(request: Request) -> Session | None:
    """The signed-in session of this request's cookie, checked now; None signs the browser out."""
    return await sessions_service(request).resolve(request.cookies.get(COOKIE_NAME))


def to_sign_in(request: Request) -> RedirectResponse:
    """To the sign-in page, coming back here afterwards; the stale cookie is dropped."""
    target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    response = RedirectResponse("/ui/sign-in?" + urlencode({"next": target}), status_code=303)
    response.delete_cookie(COOKIE_NAME, path="/")
    return response


def render(
    request: Request, template: str, session: Session | None, *, status: int = 200, **context: Any
) -> HTMLResponse:
    """A page: the template with the principal, its permissions (`can`), the CSRF value and the notice."""
    principal = session.principal if session else None

    def can(permission: str) -> bool:
        return principal is not None and role_allows(principal.role, permission)

    html = env.get_template(template).render(
        request=request,
        principal=principal,
        csrf_token=session.csrf_token if session else "",
        csrf_field=CSRF_FIELD,
        can=can,
        path=request.url.path,
        notice=request.query_params.get("notice"),
        **context,
    )
    return HTMLResponse(html, status_code=status)


def error_page(request: Request, session: Session | None, answer: ApiAnswer) -> HTMLResponse:
    """The dashboard's error page for an API answer (its status and sentence), never the JSON."""
    return render(request, "error.html", session, status=answer.status, answer=answer)


def query_of(request: Request, names: tuple[str, ...]) -> dict[str, str]:
    """The named query parameters that were given."""
    return {n: request.query_params[n] for n in names if request.query_params.get(n)}


def page_link(request: Request, cursor: str | None, names: tuple[str, ...]) -> str | None:
    """The next page's address (same filters, the API's cursor), or None on the last page."""
    if not cursor:
        return None
    return request.url.path + "?" + urlencode({**query_of(request, names), "cursor": cursor})


def same_origin(request: Request) -> bool:
    """Whether the request's `Origin`, if it sent one, is this site."""
    return origin_allowed(request.headers.get("origin"), f"{request.url.scheme}://{request.url.netloc}")


async def checked_form(request: Request, session: Session) -> FormData | None:
    """The posted form when its CSRF value matches the session's and the Origin (if sent) is ours."""
    if not same_origin(request):
        return None
    form = await request.form()
    given = form.get(CSRF_FIELD)
    return form if csrf_matches(session.csrf_token, given if isinstance(given, str) else None) else None


def csrf_refused(request: Request, session: Session) -> HTMLResponse:
    """403 for a form without this session's CSRF value (or from another site)."""
    answer = ApiAnswer(
        403, {"error": "csrf", "detail": "the form is stale or came from another site; reload"}
    )
    return error_page(request, session, answer)


async def posted_form(request: Request) -> tuple[Session, FormData] | Response:
    """The session and its CSRF-checked form, or the answer refusing the post (sign in again, or 403)."""
    session = await session_of(request)
    if session is None:
        return to_sign_in(request)
    form = await checked_form(request, session)
    if form is None:
        return csrf_refused(request, session)
    return session, form


async def list_page(
    request: Request,
    api_path: str,
    filter_names: tuple[str, ...],
    template: str,
    *,
    api_names: Mapping[str, str | None] | None = None,
    fixed_query: Mapping[str, str] | None = None,
    limit: int | None = None,
    **extra: Any,
) -> Response:
    """A filtered, keyset-paginated list: the page's filters go to the API (renamed by `api_names`,
    `None` for a page-only one), with `fixed_query` added."""
    session = await session_of(request)
    if session is None:
        return to_sign_in(request)
    filters = query_of(request, filter_names)
    names = api_names or {}
    query: dict[str, Any] = {}
    for name, value in filters.items():
        api_name = names.get(name, name)
        if api_name is not None:
            query[api_name] = value
    query.update(fixed_query or {})
    query.update(cursor=request.query_params.get("cursor"), limit=limit)
    answer = await call_api(request, session.principal, "GET", api_path, query=query)
    if not answer.ok:
        return error_page(request, session, answer)
    return render(
        request,
        template,
        session,
        items=answer.body["items"],
        filters=filters,
        next_page=page_link(request, answer.body.get("next_cursor"), filter_names),
        **extra,
    )


def back_with(path: str, notice: str) -> RedirectResponse:
    """A 303 to `path` whose notice says what happened."""
    return RedirectResponse(f"{path}?{urlencode({'notice': notice})}", status_code=303)


async def post_action(
    request: Request,
    api_path: str,
    body: Any,
    back_to: str,
    *,
    method: str = "POST",
    notice: str | Callable[[Session, ApiAnswer], Awaitable[str]],
) -> Response:
    """A form's action through the API; back to `back_to` with a notice saying what happened."""
    posted = await posted_form(request)
    if isinstance(posted, Response):
        return posted
    session, _ = posted
    answer = await call_api(request, session.principal, method, api_path, body=body)
    if not answer.ok:
        return error_page(request, session, answer)
    return back_with(back_to, notice if isinstance(notice, str) else await notice(session, answer))
