"""What the databases cannot store is refused at the door on every route (issue 35, medium).

On PostgreSQL a NUL character in a path, a query value or a body string made several routes answer 500
(`POST /webhooks/%00` among them), and a generic webhook with NaN was accepted and then failed to process.
Every HTTP route of the app is walked here: a NUL in each path parameter, in each query parameter the
OpenAPI document declares (any parameter for the routes outside it), and in every string a route's body
schema has, each answers 400 `invalid_request` naming the NUL, on both databases.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.routing import APIRoute
from starlette.routing import Route

from tests.integration.dashboard.conftest import signed_in
from tests.support.inprocess import InProcessServer

NUL_TEXT = "a\x00b"


def _walk(routes: list[Any], prefix: str) -> Iterator[tuple[str, str]]:
    for route in routes:
        if isinstance(route, (APIRoute, Route)):
            for method in sorted(route.methods or ()):
                if method != "HEAD":
                    yield method, prefix + route.path
        elif hasattr(route, "original_router"):  # a router included in the app (FastAPI keeps it whole)
            yield from _walk(route.original_router.routes, prefix + route.include_context.prefix)


def http_routes(server: InProcessServer) -> Iterator[tuple[str, str]]:
    """(method, path template) of every HTTP route of the app, those outside the OpenAPI document too."""
    yield from _walk(server.app.routes, "")


def query_names(document: dict[str, Any], method: str, template: str) -> list[str]:
    operation = document["paths"].get(template, {}).get(method.lower(), {})
    names = [p["name"] for p in operation.get("parameters", []) if p.get("in") == "query"]
    return names or ["x"]


def fill(template: str, nul_in: str | None) -> str:
    """The template with each `{param}` set to `x`, or to `%00` for `nul_in`."""
    path = template
    while "{" in path:
        start, end = path.index("{"), path.index("}")
        name = path[start + 1 : end].split(":")[0]
        path = path[:start] + ("%00" if name == nul_in else "x") + path[end + 1 :]
    return path


def params_of(template: str) -> list[str]:
    # A parameter may share its segment with literal text (`/badge/{source:path}/{workflow}.svg`).
    return re.findall(r"\{(\w+)(?::\w+)?\}", template)


def assert_refused_for_nul(answer: Any, what: str) -> None:
    assert answer.status_code == 400, f"{what}: {answer.status_code} {answer.text[:300]}"
    body = answer.json()
    assert body["error"] == "invalid_request" and "NUL" in body["detail"], f"{what}: {body}"


async def test_a_nul_in_any_path_or_query_parameter_of_any_route_is_a_400(server: InProcessServer) -> None:
    document = (await server.client.get("/api/v1/openapi.json")).json()
    requests = 0
    async with signed_in(server, server.owner_token) as browser:
        for method, template in http_routes(server):
            # A dashboard page is asked by a signed-in browser, the rest with the owner's token.
            client, headers = (browser, {}) if template.startswith("/ui") else (server.client, server.auth())
            for name in params_of(template):
                url = fill(template, name)
                answer = await client.request(method, url, headers=headers, json={})
                assert_refused_for_nul(answer, f"{method} {url}")
                requests += 1
            for name in query_names(document, method, template):
                url = f"{fill(template, None)}?{name}=%00"
                answer = await client.request(method, url, headers=headers, json={})
                assert_refused_for_nul(answer, f"{method} {url}")
                requests += 1
    assert requests > 200  # every route was reached, not a handful


def example(schema: dict[str, Any], components: dict[str, Any], depth: int = 0) -> Any:
    """A value of `schema` with every free string set to one holding a NUL (None when it has none)."""
    if "$ref" in schema:
        return example(components[schema["$ref"].rsplit("/", 1)[1]], components, depth)
    for key in ("anyOf", "oneOf", "allOf"):
        if key in schema:
            options = [s for s in schema[key] if s.get("type") != "null"]
            return example(options[0], components, depth) if options else None
    kind = schema.get("type")
    if "enum" in schema or "const" in schema or depth > 6:
        return schema.get("enum", [schema.get("const")])[0]
    if kind == "string":
        return NUL_TEXT
    if kind == "object":
        properties = schema.get("properties", {})
        if not properties:
            return {"k": NUL_TEXT}
        return {name: example(sub, components, depth + 1) for name, sub in properties.items()}
    if kind == "array":
        return [example(schema.get("items", {"type": "string"}), components, depth + 1)]
    if kind in ("integer", "number"):
        return 1
    if kind == "boolean":
        return True
    return NUL_TEXT


def json_bodies(document: dict[str, Any]) -> Iterator[tuple[str, str, Any]]:
    components = document.get("components", {}).get("schemas", {})
    for template, operations in document["paths"].items():
        for method, operation in operations.items():
            schema = (
                operation.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema")
            )
            if schema is None:
                continue
            body = example(schema, components)
            if "\\u0000" in json.dumps(body):
                yield method.upper(), fill(template, None), body


async def test_a_nul_in_any_string_of_any_json_body_is_a_400(server: InProcessServer) -> None:
    document = (await server.client.get("/api/v1/openapi.json")).json()
    bodies = list(json_bodies(document))
    assert len(bodies) > 15
    for method, url, body in bodies:
        answer = await server.client.request(method, url, json=body, headers=server.auth())
        assert_refused_for_nul(answer, f"{method} {url} {body}")


@pytest.mark.parametrize("raw", [b'{"label": NaN}', b'{"label": -Infinity}', b'{"a": [{"b": "\\u0000"}]}'])
async def test_nan_infinity_and_nul_in_a_json_body_are_a_400(server: InProcessServer, raw: bytes) -> None:
    answer = await server.client.post(
        "/api/v1/admin/tokens", content=raw, headers={**server.auth(), "Content-Type": "application/json"}
    )
    assert answer.status_code == 400 and answer.json()["error"] == "invalid_request", answer.text


async def test_a_nul_in_a_dashboard_form_is_a_400(server: InProcessServer) -> None:
    answer = await server.client.post(
        "/ui/sign-in",
        content=b"token=a%00b&next=/ui/runs",
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    )
    assert_refused_for_nul(answer, "POST /ui/sign-in")
