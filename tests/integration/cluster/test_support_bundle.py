"""`conveyor admin support-bundle --target all` (docs/design/admin.md §8.1): two coordinators on one
PostgreSQL database and a database-less worker, each configured with secrets; the whole extracted bundle is
searched for every secret value, token and key the test knows, and none is in it."""

import json
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest

from tests.support.cluster import SHARED_SECRET_KEY, STEADY_PEERS, Cluster, Node, peers_by_id
from tests.support.http import HTTP
from tests.support.processes import run_cli
from tests.support.scaler_backends import never_registering_scalers_yaml
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("cluster-processes"), pytest.mark.timeout(300)]

METRICS_TOKEN = "metrics-token-Qx81vZ"
WORKER_ADMIN_TOKEN = "worker-admin-token-Lm27pR"
SMTP_PASSWORD = "smtp-password-Hk55tW"
DATABASE_PASSWORD = "db-password-Zt93nB"  # trust authentication ignores it: only the URL carries it
STORED_SECRET = "stored-secret-value-Jd44sC"


def admin(node: Node, token: str, *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli(["admin", *args], env={"CONVEYOR_URL": node.url, "CONVEYOR_TOKEN": token}, timeout=120)


def with_password(url: str) -> str:
    scheme, rest = url.split("://", 1)
    user, host = rest.split("@", 1)
    return f"{scheme}://{user}:{DATABASE_PASSWORD}@{host}"


def extracted(path: Path, into: Path) -> dict[str, str]:
    """Every file of the archive, by its path inside it."""
    with tarfile.open(path, "r:gz") as archive:
        archive.extractall(into, filter="data")
    return {str(p.relative_to(into)): p.read_text() for p in into.rglob("*") if p.is_file()}


def test_a_bundle_from_all_three_nodes_holds_their_logs_and_status_and_no_secret(
    postgres_url: str, tmp_path: Path
) -> None:
    cluster = Cluster(tmp_path / "nodes", with_password(postgres_url))
    try:
        run(cluster, tmp_path)
    except BaseException:
        print(cluster.logs())
        raise
    finally:
        cluster.close()


def run(cluster: Cluster, tmp_path: Path) -> None:
    scalers = never_registering_scalers_yaml(tmp_path / "scalers.yaml")
    c1 = cluster.coordinator(
        "c1", CONVEYOR_METRICS_TOKEN=METRICS_TOKEN, CONVEYOR_SCALER_CONFIG=str(scalers), **STEADY_PEERS
    )
    c2 = cluster.coordinator(
        "c2", CONVEYOR_SMTP_URL=f"smtp://mailer:{SMTP_PASSWORD}@127.0.0.1:2525", **STEADY_PEERS
    )
    token = cluster.token
    join = cluster.join_token(c1)
    w1 = cluster.worker(
        "w1",
        [c1, c2],
        join_token=join,
        CONVEYOR_WORKER_ADMIN_TOKEN=WORKER_ADMIN_TOKEN,
        CONVEYOR_SCALER_CONFIG=str(scalers),
        **STEADY_PEERS,
    )
    wait_until(
        lambda: {"c2", "w1"} <= {i for i, p in peers_by_id(c1, token).items() if p["connected"]},
        what="c1 connected to c2 and w1",
    )
    stored = c1.post("/api/v1/admin/tokens", token, {"label": "second", "role": "admin"})
    assert stored.status_code == 201, stored.text
    second_token = stored.json()["token"]
    put = HTTP.put(
        c1.url + "/api/v1/admin/secrets/org/DEPLOY_KEY",
        json={"value": STORED_SECRET},
        headers={"Authorization": f"Bearer {token}"},
        timeout=10,
    )
    assert put.status_code in (200, 201, 204), put.text
    credentials = {
        name: json.loads((node.home / "peer-credential.json").read_text())["secret"]
        for name, node in (("c1", c1), ("c2", c2), ("w1", w1))
        if (node.home / "peer-credential.json").exists()
    }
    assert "w1" in credentials

    bundle = tmp_path / "bundle.tar.gz"
    made = admin(c1, second_token, "support-bundle", "--target", "all", "-o", str(bundle))
    assert made.returncode == 0, made.stdout + made.stderr
    lines = made.stdout.splitlines()
    assert [line.split(" ", 1)[0] for line in lines[:3]] == ["c1", "c2", "w1"], made.stdout
    assert all(": collected (6 files, " in line for line in lines[:3]), made.stdout
    assert lines[3].startswith(f"wrote {bundle} (")
    assert bundle.stat().st_mode & 0o077 == 0

    files = extracted(bundle, tmp_path / "out")
    for node in ("c1", "c2", "w1"):
        for name in (
            "node.json",
            "settings.json",
            "scaler.json",
            "peers.json",
            "database.json",
            "logs.jsonl",
        ):
            assert f"{node}/{name}" in files, sorted(files)
    manifest: dict[str, Any] = json.loads(files["manifest.json"])
    assert [(n["node"], n["role"], n["outcome"]) for n in manifest["nodes"]] == [
        ("c1", "coordinator", "collected"),
        ("c2", "coordinator", "collected"),
        ("w1", "worker", "collected"),
    ]
    assert json.loads(files["w1/node.json"])["role"] == "worker"
    assert json.loads(files["w1/database.json"])["database"] is None
    c1_database = json.loads(files["c1/database.json"])
    assert c1_database["reachable"] is True and c1_database["schema"]["state"] == "current"
    c1_settings = json.loads(files["c1/settings.json"])
    assert c1_settings["process"]["metrics_token"] == "[redacted]"
    assert c1_settings["process"]["secret_key"] == "[redacted]"
    assert c1_settings["process"]["database_url"].startswith("postgresql://postgres:[redacted]@")
    assert "agent_token_ttl_ms" in c1_settings["cluster"]["effective"]
    w1_settings = json.loads(files["w1/settings.json"])
    assert w1_settings["process"]["cluster_join_token"] == "[redacted]"
    assert w1_settings["process"]["worker_admin_token"] == "[redacted]"
    assert "agent_token_ttl_ms" in w1_settings["cluster"]["values"]
    assert json.loads(files["w1/scaler.json"])["scalers"][0]["name"] == "local"
    assert {p["instance_id"] for p in json.loads(files["w1/peers.json"])["peers"]} == {"c1", "c2"}
    for node in ("c1", "c2", "w1"):
        logged = [json.loads(line) for line in files[f"{node}/logs.jsonl"].splitlines()]
        assert logged and all("msg" in line for line in logged)
    assert "sent this node's part of a support bundle to c1" in files["w1/logs.jsonl"] or (
        "sent this node's part of a support bundle to c1" in w1.output()
    )

    secrets = {
        "the shared secret key": SHARED_SECRET_KEY,
        "the metrics token": METRICS_TOKEN,
        "the worker's admin token": WORKER_ADMIN_TOKEN,
        "the SMTP password": SMTP_PASSWORD,
        "the database password": DATABASE_PASSWORD,
        "a stored secret": STORED_SECRET,
        "the owner admin token": token,
        "the second admin token": second_token,
        "the worker's join token": join,
        **{f"{name}'s peer credential": secret for name, secret in credentials.items()},
    }
    everything = "\n".join(files.values())
    found = [what for what, value in secrets.items() if value in everything]
    assert not found, f"the bundle holds {found}"
    assert "cvy_admin_" + token.removeprefix("cvy_admin_")[:12] not in everything
    assert "cvy_join_" + join.removeprefix("cvy_join_")[:12] not in everything

    one = admin(c1, token, "support-bundle", "--target", "w1", "-o", str(tmp_path / "w1.tar.gz"), "--json")
    assert one.returncode == 0, one.stdout + one.stderr
    assert [n["node"] for n in json.loads(one.stdout)["nodes"]] == ["w1"]
    unknown = admin(c1, token, "support-bundle", "--target", "nobody", "-o", str(tmp_path / "x.tar.gz"))
    assert unknown.returncode == 4 and "unknown_target" in unknown.stderr
    assert not (tmp_path / "x.tar.gz").exists()
    operator = c1.post("/api/v1/admin/tokens", token, {"label": "ops", "role": "operator"}).json()["token"]
    denied = HTTP.post(
        c1.url + "/api/v1/admin/support-bundle", json={}, headers={"Authorization": f"Bearer {operator}"}
    )
    assert denied.status_code == 403 and "support_bundle.create" in denied.json()["detail"]


def test_a_bundle_from_a_coordinator_and_its_worker_on_each_database(
    any_cluster: Cluster, tmp_path: Path
) -> None:
    c1 = any_cluster.coordinator("c1", CONVEYOR_METRICS_TOKEN=METRICS_TOKEN, **STEADY_PEERS)
    token = any_cluster.token
    join = any_cluster.join_token(c1)
    any_cluster.worker(
        "w1", [c1], join_token=join, CONVEYOR_WORKER_ADMIN_TOKEN=WORKER_ADMIN_TOKEN, **STEADY_PEERS
    )
    wait_until(lambda: peers_by_id(c1, token).get("w1", {}).get("connected"), what="c1 sees w1")

    here = admin(c1, token, "support-bundle", "-o", str(tmp_path / "c1.tar.gz"), "--json")
    assert here.returncode == 0, here.stdout + here.stderr
    assert [n["node"] for n in json.loads(here.stdout)["nodes"]] == ["c1"]  # no target: the answering node

    bundle = tmp_path / "all.tar.gz"
    made = admin(c1, token, "support-bundle", "--target", "all", "-o", str(bundle), "--log-bytes", "2048")
    assert made.returncode == 0, made.stdout + made.stderr
    files = extracted(bundle, tmp_path / "out")
    database = json.loads(files["c1/database.json"])
    assert database["database"] == ("postgresql" if any_cluster.database_url else "sqlite")
    assert database["reachable"] is True
    assert 0 < len(files["w1/logs.jsonl"].encode()) <= 2048
    everything = "\n".join(files.values())
    assert not [
        v for v in (METRICS_TOKEN, WORKER_ADMIN_TOKEN, join, token, SHARED_SECRET_KEY) if v in everything
    ]
