"""The dashboard's management pages (issue 42): sources and their workflows with the "Run workflow" form,
secrets, admin and agent tokens, notification rules, and the scalers' reload. Every action is a CSRF-checked
form whose POST goes through the admin API in process, with its permission and access log."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import quote

from fastapi import APIRouter, Request
from fastapi.responses import Response
from starlette.datastructures import FormData

from conveyor.dashboard.api import ApiAnswer, call_api
from conveyor.dashboard.forms import (
    agent_token_body,
    filled,
    input_fields,
    inputs_from_form,
    label_list,
    notification_rule_body,
)
from conveyor.dashboard.pages import (
    back_with,
    error_page,
    list_page,
    post_action,
    posted_form,
    render,
    session_of,
    to_sign_in,
)
from conveyor.dashboard.service import Session
from conveyor.model.permissions import role_allows

router = APIRouter(prefix="/ui", include_in_schema=False)


# -- sources, workflows, "Run workflow" -----------------------------------------------------------------


@router.get("/sources")
async def sources_page(request: Request) -> Response:
    """Sources: kind, routing key, default branch; each links to its workflows."""
    return await list_page(request, "/sources", (), "sources.html")


# The add-source form's fields, as `POST sources` names them; the API says which a kind needs.
SOURCE_FIELDS = ("kind", "name", "path", "repo", "clone_url", "api_url", "default_branch", "webhook_secret")


@router.post("/sources/add")
async def add_source(request: Request) -> Response:
    """Add a source (source.manage); its webhook secret goes to the secret store and is never shown."""
    posted = await posted_form(request)
    if isinstance(posted, Response):
        return posted
    session, form = posted
    answer = await call_api(request, session.principal, "POST", "/sources", body=filled(form, SOURCE_FIELDS))
    if not answer.ok:
        return error_page(request, session, answer)
    return back_with(f"/ui/sources/{answer.body['id']}", f"source {answer.body['name']} added")


@router.get("/sources/{source_id}")
async def source_page(source_id: str, request: Request) -> Response:
    """One source and the workflows of its lock at the default branch (or `?ref=`)."""
    session = await session_of(request)
    if session is None:
        return to_sign_in(request)
    path = f"/sources/{quote(source_id, safe='')}"
    source = await call_api(request, session.principal, "GET", path)
    if not source.ok:
        return error_page(request, session, source)
    ref = request.query_params.get("ref") or None
    workflows = await call_api(request, session.principal, "GET", path + "/workflows", query={"ref": ref})
    return render(
        request,
        "source.html",
        session,
        source=source.body,
        ref=ref,
        workflows=workflows.body if workflows.ok else None,
        workflows_error=None if workflows.ok else workflows.detail,
    )


# The source page's switches: the form's `setting` names one `PATCH sources/{id}` field and `value` its new state.
SOURCE_SWITCHES = ("enabled", "public_badges")


@router.post("/sources/{source_id}/switch")
async def switch_source(source_id: str, request: Request) -> Response:
    """Turn a source's `enabled` or `public_badges` on or off (source.manage)."""
    posted = await posted_form(request)
    if isinstance(posted, Response):
        return posted
    session, form = posted
    setting, on = str(form.get("setting") or ""), form.get("value") == "true"
    if setting not in SOURCE_SWITCHES:
        return error_page(
            request, session, ApiAnswer(400, {"error": "invalid_request", "detail": f"no switch {setting!r}"})
        )
    path = f"/sources/{quote(source_id, safe='')}"
    answer = await call_api(request, session.principal, "PATCH", path, body={setting: on})
    if not answer.ok:
        return error_page(request, session, answer)
    return back_with(
        f"/ui{path}", f"source {answer.body['name']}: {setting.replace('_', ' ')} {'on' if on else 'off'}"
    )


@router.post("/sources/{source_id}/remove")
async def remove_source(source_id: str, request: Request) -> Response:
    """Remove a source and its secrets (source.manage)."""
    return await post_action(
        request,
        f"/sources/{quote(source_id, safe='')}",
        None,
        "/ui/sources",
        method="DELETE",
        notice=f"source {source_id} removed",
    )


@router.get("/sources/{source_id}/workflows/{workflow}")
async def workflow_page(source_id: str, workflow: str, request: Request) -> Response:
    """A workflow of a source: its recent runs and, for a `dispatch` trigger, the "Run workflow" form."""
    session = await session_of(request)
    if session is None:
        return to_sign_in(request)
    return await _workflow_page(request, session, source_id, workflow, request.query_params.get("ref"))


async def _workflow_page(
    request: Request,
    session: Session,
    source_id: str,
    workflow: str,
    ref: str | None,
    *,
    refused: ApiAnswer | None = None,
    posted: Mapping[str, Any] | None = None,
) -> Response:
    """The workflow page; after a refused run, with the API's error (and its status) and the values
    posted, so nothing typed is lost."""
    path = f"/sources/{quote(source_id, safe='')}/workflows"
    listing = await call_api(request, session.principal, "GET", path, query={"ref": ref or None})
    if not listing.ok:
        return error_page(request, session, refused or listing)
    entry = next((w for w in listing.body["workflows"] if w["name"] == workflow), None)
    if entry is None:
        missing = ApiAnswer(
            404,
            {
                "error": "not_found",
                "detail": f"the lock of {listing.body['name']} at {listing.body['ref']} has no workflow {workflow}",
            },
        )
        return error_page(request, session, refused or missing)
    runs = await call_api(
        request,
        session.principal,
        "GET",
        "/runs",
        query={"workflow": workflow, "routing_key": listing.body.get("routing_key"), "limit": 10},
    )
    dispatch = entry.get("dispatch")
    return render(
        request,
        "workflow.html",
        session,
        status=refused.status if refused is not None else 200,
        listing=listing.body,
        workflow=entry,
        fields=input_fields(dispatch["inputs"], posted) if dispatch else None,
        ref=ref or listing.body["ref"],
        refused=refused.detail if refused is not None else None,
        runs=runs.body["items"] if runs.ok else None,
    )


@router.post("/sources/{source_id}/workflows/{workflow}/run")
async def run_workflow(source_id: str, workflow: str, request: Request) -> Response:
    """Start a run through the workflow's `dispatch` trigger (`POST runs`, source.trigger) with the
    form's inputs; a refusal shows the workflow page again with the API's error, and starts nothing."""
    posted = await posted_form(request)
    if isinstance(posted, Response):
        return posted
    session, form = posted
    ref = str(form.get("ref") or "").strip() or None
    body = {"source": source_id, "workflow": workflow, "ref": ref, "inputs": inputs_from_form(form)}
    answer = await call_api(
        request, session.principal, "POST", "/runs", body={k: v for k, v in body.items() if v is not None}
    )
    if answer.status in (400, 422):
        return await _workflow_page(request, session, source_id, workflow, ref, refused=answer, posted=form)
    if not answer.ok:
        return error_page(request, session, answer)
    return back_with(
        f"/ui/runs/{answer.body['id']}", f"run #{answer.body['number']} started: {workflow} by hand"
    )


# -- secrets -----------------------------------------------------------------------------------------


@router.get("/secrets")
async def secrets_page(request: Request) -> Response:
    """Secret names, scopes and versions (never values); set and delete for roles with secret.write."""
    return await list_page(request, "/secrets", ("scope",), "secrets.html", limit=100)


def _secret_path(scope: str, name: str) -> str:
    return f"/secrets/{quote(scope, safe='/:')}/{quote(name, safe='')}"


@router.post("/secrets/set")
async def set_secret(request: Request) -> Response:
    """Create or replace a secret (secret.write). The value goes to the API and nowhere else: not into
    the notice, a redirect or an error page."""
    posted = await posted_form(request)
    if isinstance(posted, Response):
        return posted
    session, form = posted
    scope = str(form.get("scope") or "org").strip()
    name = str(form.get("name") or "").strip()
    value = form.get("value")
    answer = await call_api(
        request,
        session.principal,
        "PUT",
        _secret_path(scope, name),
        body={"value": value if isinstance(value, str) else ""},
    )
    if not answer.ok:
        return error_page(request, session, answer)
    verb = "created" if answer.status == 201 else "replaced"
    return back_with("/ui/secrets", f"secret {name} {verb} in scope {scope}")


@router.post("/secrets/delete")
async def delete_secret(request: Request) -> Response:
    """Delete a secret (secret.write)."""
    posted = await posted_form(request)
    if isinstance(posted, Response):
        return posted
    session, form = posted
    scope, name = str(form.get("scope") or ""), str(form.get("name") or "")
    answer = await call_api(request, session.principal, "DELETE", _secret_path(scope, name))
    if not answer.ok:
        return error_page(request, session, answer)
    return back_with("/ui/secrets", f"secret {name} deleted from scope {scope}")


# -- environments and org variables ------------------------------------------------------------------


@router.get("/environments")
async def environments_page(request: Request) -> Response:
    """Environments (variables, allowed branches, protection) and org variables (secret.read_meta); set and
    delete with secret.write."""
    session = await session_of(request)
    if session is None:
        return to_sign_in(request)
    environments = await call_api(request, session.principal, "GET", "/environments", query={"limit": 500})
    if not environments.ok:
        return error_page(request, session, environments)
    variables = await call_api(request, session.principal, "GET", "/variables")
    return render(
        request,
        "environments.html",
        session,
        environments=environments.body["items"],
        variables=variables.body["items"] if variables.ok else None,
        variables_error=None if variables.ok else variables.detail,
    )


async def _named_action(
    request: Request,
    api_path: Callable[[str], str],
    method: str,
    body_of: Callable[[FormData], Any],
    what: str,
) -> Response:
    """A form naming one row (`name`), sent to `method api_path(name)`; back to the page with a notice."""
    posted = await posted_form(request)
    if isinstance(posted, Response):
        return posted
    session, form = posted
    name = str(form.get("name") or "").strip()
    answer = await call_api(request, session.principal, method, api_path(name), body=body_of(form))
    if not answer.ok:
        return error_page(request, session, answer)
    return back_with("/ui/environments", what.format(name=name))


def _variable_path(name: str) -> str:
    return f"/variables/{quote(name, safe='')}"


def _environment_path(name: str) -> str:
    return f"/environments/{quote(name, safe='')}"


@router.post("/variables/set")
async def set_variable(request: Request) -> Response:
    """Set an org variable (secret.write)."""
    return await _named_action(
        request,
        _variable_path,
        "PUT",
        lambda form: {"value": str(form.get("value") or "")},
        "variable {name} set",
    )


@router.post("/variables/delete")
async def delete_variable(request: Request) -> Response:
    """Delete an org variable (secret.write)."""
    return await _named_action(
        request, _variable_path, "DELETE", lambda form: None, "variable {name} deleted"
    )


@router.post("/environments/set")
async def set_environment(request: Request) -> Response:
    """Create an environment or change its allowed branches (empty: any branch), keeping its variables
    (secret.write)."""
    return await _named_action(
        request,
        _environment_path,
        "PUT",
        lambda form: {"allowed_branches": label_list(form.get("allowed_branches"))},
        "environment {name} saved",
    )


@router.post("/environments/delete")
async def delete_environment(request: Request) -> Response:
    """Delete an environment (secret.write)."""
    return await _named_action(
        request, _environment_path, "DELETE", lambda form: None, "environment {name} deleted"
    )


# -- tokens ------------------------------------------------------------------------------------------


@router.get("/tokens")
async def tokens_page(request: Request) -> Response:
    """Admin tokens (token.manage, owners only) and agent tokens (agent.read): metadata and prefixes, never
    a hash; create (the plaintext shown once) and revoke for roles that may."""
    session = await session_of(request)
    if session is None:
        return to_sign_in(request)
    admin = None
    if role_allows(session.principal.role, "token.manage"):
        admin = await call_api(request, session.principal, "GET", "/tokens")
    agent = await call_api(request, session.principal, "GET", "/agent-tokens", query={"limit": 500})
    return render(
        request,
        "tokens.html",
        session,
        admin_tokens=admin.body["items"] if admin is not None and admin.ok else None,
        agent_tokens=agent.body["items"] if agent.ok else None,
        agent_tokens_error=None if agent.ok else agent.detail,
        roles=("owner", "admin", "operator", "auditor"),
    )


async def _create_token(
    request: Request, api_path: str, body_of: Callable[[FormData], Any], kind: str
) -> Response:
    """Mint a token through the API and show its plaintext on this one answer (never in a redirect)."""
    posted = await posted_form(request)
    if isinstance(posted, Response):
        return posted
    session, form = posted
    answer = await call_api(request, session.principal, "POST", api_path, body=body_of(form))
    if not answer.ok:
        return error_page(request, session, answer)
    return render(request, "token_created.html", session, status=201, created=answer.body, kind=kind)


@router.post("/tokens/create")
async def create_admin_token(request: Request) -> Response:
    """Create an admin token (token.manage)."""
    return await _create_token(
        request,
        "/tokens",
        lambda form: filled(form, ("label", "role", "routing_key", "expires_in_days")),
        "admin",
    )


@router.post("/tokens/{token_id}/revoke")
async def revoke_admin_token(token_id: str, request: Request) -> Response:
    """Revoke an admin token (token.manage); its sessions end at their next request."""
    return await post_action(
        request,
        f"/tokens/{quote(token_id, safe='')}",
        None,
        "/ui/tokens",
        method="DELETE",
        notice=f"admin token {token_id} revoked",
    )


@router.post("/agent-tokens/create")
async def create_agent_token(request: Request) -> Response:
    """Create a static agent token (agent.manage)."""
    return await _create_token(request, "/agent-tokens", agent_token_body, "agent")


@router.post("/agent-tokens/{token_id}/revoke")
async def revoke_agent_token(token_id: str, request: Request) -> Response:
    """Revoke an agent token (agent.manage); its connected agents are closed."""
    return await post_action(
        request,
        f"/agent-tokens/{quote(token_id, safe='')}",
        None,
        "/ui/tokens",
        method="DELETE",
        notice=f"agent token {token_id} revoked",
    )


# -- notification rules ------------------------------------------------------------------------------

NOTIFY_ON = ("failed", "fixed", "succeeded", "approval_requested")


@router.get("/notifications")
async def notifications_page(request: Request) -> Response:
    """Notification rules (source.read; a webhook shown by scheme and host); add and remove (source.manage)."""
    return await list_page(request, "/notification-rules", (), "notifications.html", notify_on=NOTIFY_ON)


@router.post("/notifications/create")
async def create_notification_rule(request: Request) -> Response:
    """Add a rule (source.manage)."""
    posted = await posted_form(request)
    if isinstance(posted, Response):
        return posted
    session, form = posted
    on = [str(value) for value in form.getlist("on")]
    answer = await call_api(
        request, session.principal, "POST", "/notification-rules", body=notification_rule_body(form, on)
    )
    if not answer.ok:
        return error_page(request, session, answer)
    return back_with("/ui/notifications", f"notification rule {answer.body['id']} added")


@router.post("/notifications/{rule_id}/remove")
async def remove_notification_rule(rule_id: str, request: Request) -> Response:
    """Remove a rule (source.manage)."""
    return await post_action(
        request,
        f"/notification-rules/{quote(rule_id, safe='')}",
        None,
        "/ui/notifications",
        method="DELETE",
        notice=f"notification rule {rule_id} removed",
    )


@router.post("/scalers/reload")
async def reload_scalers(request: Request) -> Response:
    """Re-read the scalers' configuration (scaler.manage); all of it applies or none."""
    return await post_action(
        request, "/scaler/reload", None, "/ui/agents", notice="scaler configuration reloaded"
    )
