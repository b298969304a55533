"""Configuration: one registry of known names, YAML below env below flags, knob defaults validated."""

from pathlib import Path

import pytest

from conveyor.model.knobs import CLUSTER_KNOBS_BY_NAME
from conveyor.server.config import (
    ConfigError,
    load_settings,
    trusted_proxy_entries,
    unknown_conveyor_variables,
)


def test_typo_in_variable_name_names_the_nearest_valid_one() -> None:
    with pytest.raises(ConfigError, match="CONVEYOR_PROT.*did you mean CONVEYOR_PORT"):
        load_settings(environ={"CONVEYOR_PROT": "1"})


def test_variables_of_clients_agents_steps_and_tests_are_accepted() -> None:
    environ = {
        "CONVEYOR_URL": "http://x",
        "CONVEYOR_TOKEN": "t",
        "CONVEYOR_AGENT_LABELS": "a,b",
        "CONVEYOR_RUN_ID": "r",
        "CONVEYOR_WORKSPACE": "/w",
        "CONVEYOR_TEST_ANYTHING": "1",
        "CONVEYOR_AGENT_ENV_FOO": "bar",
        "CONVEYOR_REROUTE_ACK_TIMEOUT_MS": "2000",
    }
    assert unknown_conveyor_variables(environ) == []
    settings = load_settings(environ=environ)
    assert settings.knobs == {"reroute_ack_timeout_ms": 2000}


def test_unrelated_variables_are_ignored() -> None:
    assert unknown_conveyor_variables({"PATH": "/bin", "CONVEYORX": "1"}) == []


def test_database_url_absent_means_sqlite_in_home(tmp_path: Path) -> None:
    settings = load_settings(environ={"CONVEYOR_HOME": str(tmp_path)})
    assert settings.effective_database_url == f"sqlite:///{tmp_path / 'conveyor.db'}"


def test_flags_beat_env_which_beats_yaml(tmp_path: Path) -> None:
    config = tmp_path / "conveyor.yaml"
    config.write_text("port: 9000\nhost: 0.0.0.0\nlog_level: DEBUG\n")
    settings = load_settings(
        config_file=config, environ={"CONVEYOR_PORT": "9100"}, overrides={"host": "127.0.0.2"}
    )
    assert (settings.port, settings.host, settings.log_level) == (9100, "127.0.0.2", "DEBUG")


def test_unknown_yaml_key_is_an_error_naming_the_nearest(tmp_path: Path) -> None:
    config = tmp_path / "conveyor.yaml"
    config.write_text("prot: 9000\n")
    with pytest.raises(ConfigError, match="'prot'.*did you mean port"):
        load_settings(config_file=config, environ={})


def test_bad_value_is_an_error_naming_the_variable() -> None:
    with pytest.raises(ConfigError, match="CONVEYOR_PORT"):
        load_settings(environ={"CONVEYOR_PORT": "seventy"})


def test_knob_default_out_of_range_is_refused() -> None:
    with pytest.raises(ConfigError, match="firecracker_api_socket_wait_ms must be between 100 and 60000"):
        load_settings(environ={"CONVEYOR_FIRECRACKER_API_SOCKET_WAIT_MS": "5"})


def test_knob_default_falls_back_to_builtin() -> None:
    settings = load_settings(environ={})
    knob = CLUSTER_KNOBS_BY_NAME["unroutable_grace_ms"]
    assert settings.knob_default(knob) == 120_000


def test_a_worker_admin_token_is_for_workers_only(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="CONVEYOR_WORKER_ADMIN_TOKEN is for workers"):
        load_settings(environ={"CONVEYOR_WORKER_ADMIN_TOKEN": "t"})
    worker = load_settings(
        environ={
            "CONVEYOR_WORKER_ADMIN_TOKEN": "t",
            "CONVEYOR_CLUSTER_ROLE": "worker",
            "CONVEYOR_CLUSTER_COORDINATOR_URLS": "http://c1:8470",
        }
    )
    assert worker.worker_admin_token == "t" and worker.worker_drain_timeout_ms == 300_000


@pytest.mark.parametrize(
    ("environ", "overrides", "yaml_text"),
    [
        ({}, {"cluster_role": "worker"}, ""),
        ({"CONVEYOR_CLUSTER_ROLE": "worker"}, {}, ""),
        ({}, {}, "cluster_role: worker\n"),
    ],
)
def test_a_worker_without_coordinators_is_refused_naming_the_flag(
    tmp_path: Path, environ: dict[str, str], overrides: dict[str, str], yaml_text: str
) -> None:
    config = tmp_path / "conveyor.yaml"
    config.write_text(yaml_text or "{}\n")
    with pytest.raises(ConfigError, match="worker mode needs its coordinators: pass --coordinator"):
        load_settings(config_file=config, environ=environ, overrides=overrides)


def test_a_worker_with_coordinators_and_a_join_token_loads() -> None:
    settings = load_settings(
        environ={
            "CONVEYOR_CLUSTER_ROLE": "worker",
            "CONVEYOR_CLUSTER_COORDINATOR_URLS": "http://c1:8470,http://c2:8470",
            "CONVEYOR_CLUSTER_JOIN_TOKEN": "cvy_join_x",
        }
    )
    assert settings.cluster_role == "worker" and settings.cluster_join_token == "cvy_join_x"
    assert load_settings(environ={}).cluster_role == "coordinator"


def test_coordinator_urls_on_a_coordinator_are_refused() -> None:
    with pytest.raises(ConfigError, match="CONVEYOR_CLUSTER_COORDINATOR_URLS is for workers"):
        load_settings(environ={"CONVEYOR_CLUSTER_COORDINATOR_URLS": "http://c:8470"})


def test_a_typo_in_an_event_setting_names_the_nearest_valid_one() -> None:
    # The events_* and cron_tick_seconds settings are settings like any other: no prefix lets typos through.
    with pytest.raises(
        ConfigError, match="CONVEYOR_EVENTS_POLL_SECOND.*did you mean CONVEYOR_EVENTS_POLL_SECONDS"
    ):
        load_settings(environ={"CONVEYOR_EVENTS_POLL_SECOND": "1"})
    with pytest.raises(ConfigError, match="CONVEYOR_CRON_TICK.*did you mean CONVEYOR_CRON_TICK_SECONDS"):
        load_settings(environ={"CONVEYOR_CRON_TICK": "1"})


def test_the_agents_kill_grace_is_an_agent_variable_not_a_server_setting(tmp_path: Path) -> None:
    # A server started with it (it forwards its environment to the agents it spawns) still boots …
    assert load_settings(environ={"CONVEYOR_KILL_GRACE_MS": "500"})
    # … but the server reads nothing of it, so its config file refuses it instead of ignoring it.
    config = tmp_path / "conveyor.yaml"
    config.write_text("kill_grace_ms: 500\n")
    with pytest.raises(ConfigError, match="'kill_grace_ms'"):
        load_settings(config_file=config, environ={})


def test_trusted_proxies_are_none_by_default_and_take_addresses_and_networks() -> None:
    assert trusted_proxy_entries(load_settings(environ={}).trusted_proxies) == []
    settings = load_settings(environ={"CONVEYOR_TRUSTED_PROXIES": " 10.0.0.1, 192.168.0.0/16 ,::1"})
    assert trusted_proxy_entries(settings.trusted_proxies) == ["10.0.0.1", "192.168.0.0/16", "::1"]


def test_a_trusted_proxy_that_is_not_an_address_is_a_boot_error() -> None:
    with pytest.raises(ConfigError, match="not an IP address or a CIDR network"):
        load_settings(environ={"CONVEYOR_TRUSTED_PROXIES": "proxy.example"})
