"""The shared scaler configuration (docs/design/scaler.md §11): a set on one coordinator is validated as boot
and reload validate, stored with a version, and reloaded by every node that runs no local `scalers.yaml`:
the other coordinators, and workers through their settings snapshot."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.cluster import Cluster, Node, peers_by_id
from tests.support.http import HTTP
from tests.support.processes import run_cli
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("cluster-processes"), pytest.mark.timeout(300)]

FLEET = """\
version: 1
scalers:
  - {name: fleet, type: bare-metal, max_agents: 2, label_sets: [{labels: [fleet]}]}
"""
FLEET_V2 = """\
version: 1
scalers:
  - {name: fleet-big, type: bare-metal, max_agents: 4, label_sets: [{labels: [fleet, big]}]}
"""
MINE = """\
version: 1
scalers:
  - {name: mine, type: bare-metal, max_agents: 1, label_sets: [{labels: [mine]}]}
"""
# Two problems a reload would report: an unknown key, and one label set served by two scalers.
BAD = """\
version: 1
scalers:
  - {name: fleet, type: bare-metal, max_agents: 2, colour: red, label_sets: [{labels: [fleet]}]}
  - {name: twin, type: bare-metal, max_agents: 1, label_sets: [{labels: [mine]}]}
  - {name: other, type: bare-metal, max_agents: 1, label_sets: [{labels: [mine]}]}
"""


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def scaler_status(node: Node, token: str) -> dict[str, Any]:
    answer = node.get("/api/v1/admin/scaler/status", token)
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    return body


def running(node: Node, token: str) -> list[str]:
    """The node's scalers that take new work (a removed one retires until its agents are gone)."""
    return [s["name"] for s in scaler_status(node, token)["scalers"] if s["state"] != "retiring"]


def put_config(node: Node, token: str, content: str) -> Any:
    return HTTP.put(
        node.url + "/api/v1/admin/scaler/config", json={"content": content}, headers=auth(token), timeout=30
    )


def cli(node: Node, token: str, *args: str, input_text: str | None = None) -> Any:
    return run_cli(["admin", "--url", node.url, "--token", token, *args], input_text=input_text)


def cluster_settings_version(node: Node, token: str) -> int:
    answer = node.get("/api/v1/admin/cluster-settings", token)
    assert answer.status_code == 200, answer.text
    return int(answer.json()["version"])


def with_local_file(cluster: Cluster, name: str, content: str) -> Path:
    """The node's home with a `scalers.yaml` in it, written before the node starts."""
    home = cluster.root / name
    home.mkdir(parents=True, exist_ok=True)
    path = home / "scalers.yaml"
    path.write_text(content)
    return path


def test_a_set_applies_on_the_coordinator_and_its_worker_while_a_worker_with_a_local_file_keeps_it(
    any_cluster: Cluster,
) -> None:
    c1 = any_cluster.coordinator("c1")
    token = any_cluster.token
    w1 = any_cluster.worker("w1", [c1], join_token=any_cluster.join_token(c1))
    with_local_file(any_cluster, "w2", MINE)
    w2 = any_cluster.worker("w2", [c1], join_token=any_cluster.join_token(c1))
    assert running(c1, token) == []
    assert scaler_status(c1, token)["config"]["origin"] == "none"

    done = cli(c1, token, "scaler", "config", "set", "-", input_text=FLEET)

    assert done.returncode == 0, done.stderr
    assert "stored as version 1" in done.stdout
    wait_until(lambda: running(c1, token) == ["fleet"], what="c1 runs the shared scaler")
    config = scaler_status(c1, token)["config"]
    assert (config["origin"], config["shared_version"], config["shared_error"]) == ("shared", 1, None)
    settings_version = cluster_settings_version(c1, token)
    wait_until(
        lambda: peers_by_id(c1, token)[w1.name]["scalers"] == ["fleet"], what="w1 runs the shared scaler"
    )
    # w2 pulled the same snapshot (its applied settings version is the new one) and kept its own file.
    wait_until(
        lambda: peers_by_id(c1, token)[w2.name]["applied_settings_version"] == settings_version,
        what="w2 applied the new settings version",
    )
    assert peers_by_id(c1, token)[w2.name]["scalers"] == ["mine"]
    got = cli(c1, token, "scaler", "config", "get", "--json")
    assert got.returncode == 0, got.stderr
    assert '"content": ' in got.stdout and '"version": 1' in got.stdout
    rows = c1.get("/api/v1/admin/access-log?target_type=scaler_config", token).json()["items"]
    assert [(r["action"], r["outcome"]) for r in rows] == [("scaler.config.set", "allowed")]


def test_validate_and_set_refuse_a_bad_config_with_every_problem_and_store_nothing(
    any_cluster: Cluster,
) -> None:
    c1 = any_cluster.coordinator("c1")
    token = any_cluster.token
    assert put_config(c1, token, FLEET).status_code == 200
    wait_until(lambda: running(c1, token) == ["fleet"], what="c1 runs the shared scaler")
    before = cluster_settings_version(c1, token)

    checked = HTTP.post(
        c1.url + "/api/v1/admin/scaler/config/validate",
        json={"content": BAD},
        headers=auth(token),
        timeout=30,
    )
    refused = put_config(c1, token, BAD)
    done = cli(c1, token, "scaler", "config", "validate", "-", input_text=BAD)

    for answer in (checked, refused):
        assert answer.status_code == 422, answer.text
        body = answer.json()
        assert body["error"] == "scaler_config_invalid"
        assert "scalers[fleet]: unknown key colour" in body["detail"]
        assert "label set [mine] is also served by scaler twin" in body["detail"]
    assert done.returncode == 2
    assert "  <shared scaler config v2>: scalers[fleet]: unknown key colour" in done.stderr
    stored = c1.get("/api/v1/admin/scaler/config", token).json()
    assert (stored["version"], stored["content"]) == (1, FLEET)
    assert cluster_settings_version(c1, token) == before
    assert running(c1, token) == ["fleet"]
    # A valid one passes validate without being stored, and setting the stored text again changes nothing.
    valid = HTTP.post(
        c1.url + "/api/v1/admin/scaler/config/validate",
        json={"content": FLEET_V2},
        headers=auth(token),
        timeout=30,
    )
    assert (valid.status_code, valid.json()) == (200, {"valid": True, "scalers": ["fleet-big"]})
    again = put_config(c1, token, FLEET)
    assert (again.status_code, again.json()["changed"], again.json()["version"]) == (200, False, 1)
    assert c1.get("/api/v1/admin/scaler/config", token).json()["version"] == 1
    assert cluster_settings_version(c1, token) == before
    # Each set is in the access log, the refused one as an error with its 422.
    rows = c1.get("/api/v1/admin/access-log?action=scaler.config.set", token).json()["items"]
    assert sorted((r["outcome"], r["status_code"]) for r in rows) == [
        ("allowed", 200),
        ("allowed", 200),
        ("error", 422),
    ]


def test_a_coordinators_local_file_wins_until_it_is_removed_and_the_scaler_reloaded(
    any_cluster: Cluster,
) -> None:
    local = with_local_file(any_cluster, "c1", MINE)
    c1 = any_cluster.coordinator("c1")
    token = any_cluster.token

    assert put_config(c1, token, FLEET).status_code == 200

    wait_until(
        lambda: scaler_status(c1, token)["config"]["stored_shared_version"] == 1,
        what="c1 holds the stored version",
    )
    assert running(c1, token) == ["mine"]
    assert scaler_status(c1, token)["config"]["origin"] == "local"
    local.unlink()
    reloaded = c1.post("/api/v1/admin/scaler/reload", token)
    assert reloaded.status_code == 200, reloaded.text
    assert running(c1, token) == ["fleet"]
    assert scaler_status(c1, token)["config"]["origin"] == "shared"


def test_a_set_on_one_coordinator_takes_effect_on_the_other_and_on_the_worker(pg_cluster: Cluster) -> None:
    c1 = pg_cluster.coordinator("c1")
    c2 = pg_cluster.coordinator("c2")
    token = pg_cluster.token
    w1 = pg_cluster.worker("w1", [c1, c2], join_token=pg_cluster.join_token(c1))

    done = cli(c1, token, "scaler", "config", "set", "-", input_text=FLEET)
    assert done.returncode == 0, done.stderr

    for node in (c1, c2):
        wait_until(lambda node=node: running(node, token) == ["fleet"], what=f"{node.name} runs fleet")
    wait_until(lambda: peers_by_id(c2, token)[w1.name]["scalers"] == ["fleet"], what="w1 runs fleet")

    assert put_config(c2, token, FLEET_V2).status_code == 200

    for node in (c1, c2):
        wait_until(lambda node=node: running(node, token) == ["fleet-big"], what=f"{node.name} runs v2")
        assert scaler_status(node, token)["config"]["shared_version"] == 2
    wait_until(lambda: peers_by_id(c1, token)[w1.name]["scalers"] == ["fleet-big"], what="w1 runs v2")
