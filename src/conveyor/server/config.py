"""Server configuration: `CONVEYOR_*` variables, an optional YAML file, and the one registry of known names.

Every `CONVEYOR_*` name any component reads is known here, so a typo (`CONVEYOR_PROT`) is a boot error
naming the nearest valid name, while a server started inside a job or a test (which inherits step
variables, client variables and `CONVEYOR_TEST_*`) still boots.
"""

from __future__ import annotations

import difflib
import ipaddress
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from conveyor.errors import ConveyorError
from conveyor.model.knobs import ALL_KNOBS, Knob

ENV_PREFIX = "CONVEYOR_"
DEFAULT_PORT = 8470


class ConfigError(ConveyorError):
    """The configuration cannot be used; the message says what to change."""


def trusted_proxy_entries(value: str) -> list[str]:
    """The comma-separated entries of `CONVEYOR_TRUSTED_PROXIES`."""
    return [entry.strip() for entry in value.split(",") if entry.strip()]


class Settings(BaseSettings):
    """Process configuration of `conveyor server` / `conveyor up` (env `CONVEYOR_<FIELD>`)."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="forbid", case_sensitive=False)

    # --- process
    home: Path = Field(default_factory=lambda: Path.home() / ".conveyor")
    host: str = "127.0.0.1"
    port: int = Field(default=DEFAULT_PORT, ge=0, le=65535)
    database_url: str | None = None
    no_migrate: bool = False
    log_format: Literal["auto", "json", "plain"] = "auto"
    log_level: str = "INFO"
    metrics_token: str | None = None
    public_url: str | None = None
    db_pool_size: int = Field(default=10, ge=1, le=200)
    ready_cache_ms: int = Field(default=1000, ge=0)
    ready_db_timeout_ms: int = Field(default=2000, ge=1)
    startup_retry_ms: int = Field(default=1000, ge=10)
    shutdown_grace_ms: int = Field(default=10_000, ge=0)
    access_log_flush_ms: int = Field(default=500, ge=10)
    # Addresses (IPs or CIDR networks, comma-separated) whose X-Forwarded-For/-Proto are believed; none
    # by default, so a client cannot pick the address the sign-in and claim throttles count.
    trusted_proxies: str = ""
    # A connection must send a whole request head within this long (from connecting, or after its last
    # answer): slow or stalled headers are closed instead of holding the socket.
    http_header_timeout_ms: int = Field(default=10_000, ge=100)

    # --- dashboard (docs/dashboard.md)
    dashboard_session_idle_ms: int = Field(default=8 * 3600 * 1000, ge=1000)
    dashboard_sign_in_max_failures: int = Field(default=5, ge=1)
    dashboard_sign_in_window_ms: int = Field(default=60_000, ge=100)
    # Each scaled job leaves an offline ephemeral agent behind; the agents page hides those gone this long.
    dashboard_agent_gone_ms: int = Field(default=600_000, ge=0)

    # --- secrets at rest (docs/design/admin.md §6)
    secret_key: str | None = None
    secret_key_file: Path | None = None
    secret_key_old: str | None = None
    secret_key_old_file: Path | None = None

    # --- provenance of artifacts (docs/design/artifacts.md §9): the Ed25519 signing key
    provenance_key: str | None = None
    provenance_key_file: Path | None = None

    # --- cluster (docs/design/cluster.md §1)
    cluster_role: Literal["coordinator", "worker"] = "coordinator"
    cluster_coordinator_urls: str | None = None
    instance_id: str | None = None
    cluster_advertise_url: str | None = None
    cluster_join_token: str | None = None
    cluster_heartbeat_interval_ms: int = Field(default=10_000, ge=10)
    cluster_peer_stale_beats: int = Field(default=3, ge=1)
    cluster_lease_ttl_ms: int = Field(default=15_000, ge=100)
    cluster_lease_renew_ms: int = Field(default=5_000, ge=10)
    cluster_settings_cache_ttl_ms: int = Field(default=10_000, ge=0)
    worker_drain_timeout_ms: int = Field(default=300_000, ge=0)
    worker_admin_token: str | None = None

    # --- execution (docs/design/execution.md)
    dispatch_poll_ms: int = Field(default=2000, ge=10)
    dispatch_max_attempts: int = Field(default=5, ge=1)
    agent_dead_after_ms: int = Field(default=45_000, ge=100)
    recovery_grace_ms: int = Field(default=120_000, ge=0)
    sweep_interval_ms: int = Field(default=10_000, ge=10)
    # How often the leader's retention sweep runs (`run_retention_days`, `audit_retention_days`,
    # finished deliveries past `webhook_dedup_ttl_ms`).
    retention_interval_ms: int = Field(default=600_000, ge=10)
    log_max_step_bytes: int = Field(default=10 * 1024 * 1024, ge=1024)
    log_keepalive_ms: int = Field(default=15_000, ge=10)  # SSE comment interval of idle log streams
    log_poll_ms: int = Field(default=1000, ge=10)  # log streams re-read this often without a wake-up
    ws_max_message_bytes: int = Field(default=4 * 1024 * 1024, ge=1024)
    orchestrator_url: str | None = None

    # --- artifacts and the blob store (docs/design/artifacts.md §2)
    blob_url: str = ""  # empty: files under $CONVEYOR_HOME/blobs; file:///path; s3://bucket/prefix
    blob_s3_endpoint: str | None = None
    blob_s3_region: str | None = None
    blob_s3_access_key_id: str | None = None
    blob_s3_secret_access_key: str | None = None
    blob_s3_allow_http: bool = False
    # An upload younger than this, and a blob touched this recently, is never swept.
    blob_grace_ms: int = Field(default=3_600_000, ge=0)
    # An object store's blobs are fetched by a coordinator's agents from the store itself, by a presigned
    # URL (docs/design/artifacts.md §4); off where agents cannot reach the store.
    blob_direct_downloads: bool = True

    # --- scaler (docs/design/scaler.md)
    scaler_config: Path | None = None
    scaler_config_dir: Path | None = None
    scaler_builtin_local: bool = False  # `conveyor up`: the built-in `local` scaler when no file exists
    # Webhook sources and their secrets cached per coordinator (dropped on change; this bounds a lost hint).
    source_cache_ttl_ms: int = Field(default=1000, ge=0, le=60_000)
    # The scaler's round runs when jobs are enqueued or capacity changes, and at least this often.
    scaler_poll_ms: int = Field(default=1000, ge=10)

    # --- internal events (docs/events.md "Settings and metrics"; `conveyor.events.startup.event_settings`)
    events_concurrency: int = Field(default=8, ge=1)
    events_lease_seconds: float = Field(default=60.0, gt=0)
    events_poll_seconds: float = Field(default=5.0, gt=0)
    events_scan_seconds: float = Field(default=10.0, gt=0)
    events_cleanup_seconds: float = Field(default=3600.0, gt=0)
    events_retry_base_seconds: float = Field(default=5.0, gt=0)
    events_retry_max_seconds: float = Field(default=300.0, gt=0)
    events_max_chain_depth: int = Field(default=10, ge=1)
    events_batch_max_runs: int = Field(default=100, ge=1)
    cron_tick_seconds: float = Field(default=15.0, gt=0)
    # Notification email (docs/design/events.md §10): smtp://[user:password@]host[:port] or smtps://…
    smtp_url: str | None = None
    smtp_from: str | None = None

    # --- env/YAML defaults of the fleet and org knobs (`CONVEYOR_<KNOB>`), filled by `load_settings`
    knobs: dict[str, int] = Field(default_factory=dict)

    def knob_default(self, knob: Knob) -> int | None:
        """The configured default of a knob: env/YAML when given, else the built-in default."""
        return self.knobs.get(knob.name, knob.default)

    @field_validator("trusted_proxies")
    @classmethod
    def _check_proxies(cls, value: str) -> str:
        for entry in trusted_proxy_entries(value):
            try:
                ipaddress.ip_network(entry, strict=False)
            except ValueError:
                raise ValueError(f"{entry!r} is not an IP address or a CIDR network") from None
        return value

    @field_validator("home", mode="before")
    @classmethod
    def _expand_home(cls, value: Any) -> Any:
        return Path(value).expanduser() if isinstance(value, str) else value

    @property
    def sqlite_path(self) -> Path:
        """Where the embedded database lives when no `CONVEYOR_DATABASE_URL` is set."""
        return self.home / "conveyor.db"

    @property
    def effective_database_url(self) -> str:
        """The database this node uses: PostgreSQL when configured, else SQLite in the home."""
        return self.database_url or f"sqlite:///{self.sqlite_path}"

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Flags (init) beat the environment, which beats the YAML file (passed in through init as a
        # lower-priority source by `load_settings`).
        return (init_settings, env_settings)


# Names that are not server settings but that some component reads (client, agent, step context).
CLIENT_NAMES = frozenset({"CONVEYOR_URL", "CONVEYOR_TOKEN"})
AGENT_NAMES = frozenset(
    {
        "CONVEYOR_AGENT_URL",
        "CONVEYOR_AGENT_TOKEN",
        "CONVEYOR_AGENT_TOKEN_FILE",
        "CONVEYOR_AGENT_ID",
        "CONVEYOR_AGENT_LABELS",
        "CONVEYOR_AGENT_CAPACITY",
        "CONVEYOR_AGENT_EPHEMERAL",
        "CONVEYOR_AGENT_HOME",
        "CONVEYOR_AGENT_KEEP_WORKSPACE",
        "CONVEYOR_AGENT_HEARTBEAT_MS",
        # The grace between SIGTERM and SIGKILL of a cancelled step (docs/agent.md); a server forwards it
        # to the agents it spawns, so it boots with it set.
        "CONVEYOR_KILL_GRACE_MS",
    }
)
STEP_NAMES = frozenset(
    "CONVEYOR_" + name
    for name in (
        "RUN_ID JOB_ID WORKFLOW JOB SHA REF BRANCH EVENT_TYPE WORKSPACE ENV PATH LOCAL "
        "ATTEMPT RUN_NUMBER STEP OUTPUT"
    ).split()
)
TOOLING_NAMES = frozenset({"CONVEYOR_CONFIG"})
# Whole families: test hooks (inert unless a test sets them) and variables the agent forwards to steps.
KNOWN_PREFIXES = ("CONVEYOR_TEST_", "CONVEYOR_AGENT_ENV_")

_extra_names: set[str] = set()


def register_known_names(*names: str) -> None:
    """Let a component declare `CONVEYOR_*` names it reads that are not `Settings` fields."""
    _extra_names.update(names)


def known_names() -> frozenset[str]:
    """Every exact `CONVEYOR_*` name some component of Conveyor reads."""
    fields = {ENV_PREFIX + name.upper() for name in Settings.model_fields if name != "knobs"}
    fields |= {ENV_PREFIX + knob.name.upper() for knob in ALL_KNOBS}
    return frozenset(fields | CLIENT_NAMES | AGENT_NAMES | STEP_NAMES | TOOLING_NAMES | _extra_names)


def unknown_conveyor_variables(environ: Mapping[str, str]) -> list[tuple[str, str | None]]:
    """Return (name, nearest valid name or None) for every unrecognised `CONVEYOR_*` variable."""
    names = known_names()
    problems: list[tuple[str, str | None]] = []
    for key in sorted(environ):
        upper = key.upper()
        if not upper.startswith(ENV_PREFIX) or upper in names or upper.startswith(KNOWN_PREFIXES):
            continue
        close = difflib.get_close_matches(upper, sorted(names), n=1, cutoff=0.6)
        problems.append((key, close[0] if close else None))
    return problems


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise ConfigError(f"config file {path} does not exist") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path} is not valid YAML: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping of setting names to values")
    return {str(key).lower(): value for key, value in data.items()}


def load_settings(
    *,
    config_file: Path | None = None,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Settings:
    """Build the settings from flags (`overrides`) > environment > YAML file > defaults.

    Raises `ConfigError` for an unknown `CONVEYOR_*` variable, an unknown YAML key or a bad value.
    """
    env = os.environ if environ is None else environ
    problems = unknown_conveyor_variables(env)
    if problems:
        lines = [
            f"unknown environment variable {name}" + (f"; did you mean {near}?" if near else "")
            for name, near in problems
        ]
        raise ConfigError("; ".join(lines))
    file_values = _read_yaml(config_file) if config_file else {}
    env_values = {
        key[len(ENV_PREFIX) :].lower(): value
        for key, value in env.items()
        if key.upper().startswith(ENV_PREFIX) and key[len(ENV_PREFIX) :].lower() in Settings.model_fields
    }
    knob_values = _knob_values(file_values, env, config_file)
    file_values = {k: v for k, v in file_values.items() if k not in _KNOBS_BY_NAME}
    merged: dict[str, Any] = {**file_values, **env_values, **dict(overrides or {}), "knobs": knob_values}
    unknown_keys = sorted(set(file_values) - set(Settings.model_fields))
    if unknown_keys:
        near = difflib.get_close_matches(unknown_keys[0], list(Settings.model_fields), n=1)
        hint = f"; did you mean {near[0]}?" if near else ""
        raise ConfigError(f"unknown setting {unknown_keys[0]!r} in {config_file}{hint}")
    try:
        # Values are passed explicitly, so the model must not read the process environment again.
        settings = _SettingsFromValues(**merged)
    except ValidationError as exc:
        details = "; ".join(
            f"{ENV_PREFIX}{'.'.join(str(p) for p in err['loc']).upper()}: {err['msg']}"
            for err in exc.errors()
        )
        raise ConfigError(f"invalid configuration: {details}") from exc
    unbuilt = not_yet_available(settings)
    if unbuilt:
        raise ConfigError("; ".join(unbuilt))
    return settings


def not_yet_available(settings: Settings) -> list[str]:
    """Why `settings` ask for something this build does not do (yet) or cannot work (empty when fine)."""
    problems = []
    if settings.cluster_role == "worker" and not (settings.cluster_coordinator_urls or "").strip():
        problems.append(
            "worker mode needs its coordinators: pass --coordinator URL[,URL…] or set "
            "CONVEYOR_CLUSTER_COORDINATOR_URLS"
        )
    if settings.cluster_role == "coordinator" and settings.cluster_coordinator_urls:
        problems.append(
            "CONVEYOR_CLUSTER_COORDINATOR_URLS is for workers (--role worker); coordinators find each "
            "other through the database"
        )
    if settings.cluster_role == "coordinator" and settings.worker_admin_token:
        problems.append(
            "CONVEYOR_WORKER_ADMIN_TOKEN is for workers (--role worker): it guards a worker's own /drain and "
            "/resume; drain a coordinator with `conveyor admin orchestrator drain`"
        )
    return problems


_KNOBS_BY_NAME = {knob.name: knob for knob in ALL_KNOBS}


def _knob_values(
    file_values: Mapping[str, Any], env: Mapping[str, str], source: Path | None
) -> dict[str, int]:
    values: dict[str, int] = {}
    candidates = [(k, v, str(source)) for k, v in file_values.items() if k in _KNOBS_BY_NAME]
    candidates += [
        (key[len(ENV_PREFIX) :].lower(), value, key)
        for key, value in env.items()
        if key.upper().startswith(ENV_PREFIX) and key[len(ENV_PREFIX) :].lower() in _KNOBS_BY_NAME
    ]
    for name, raw, origin in candidates:
        knob = _KNOBS_BY_NAME[name]
        try:
            value = int(raw)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{origin}: {name} must be an integer, got {raw!r}") from exc
        if not knob.minimum <= value <= knob.maximum:
            raise ConfigError(f"{origin}: {knob.describe_range()}, got {value}")
        values[name] = value
    return values


class _SettingsFromValues(Settings):
    """`Settings` built only from the values `load_settings` merged (no second environment read)."""

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings,)
