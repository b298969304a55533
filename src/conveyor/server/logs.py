"""Structured logging: one JSON object per line on stdout, or plain text on a terminal."""

from __future__ import annotations

import json
import logging
import sys
from contextvars import ContextVar
from typing import Any

from conveyor.model.ids import format_rfc3339, utc_now
from conveyor.runtime.node import logged_instance_id
from conveyor.server.log_ring import log_ring

# Ids a log line carries when the code that logs runs on behalf of a request, run, job or event.
CONTEXT_FIELDS = ("request_id", "run_id", "job_id", "event_id", "delivery_id", "agent_id")
log_context: ContextVar[dict[str, str]] = ContextVar("conveyor_log_context", default={})  # noqa: B039


class JsonFormatter(logging.Formatter):
    """`ts, level, msg, logger, instance_id, <context ids>, error` as one JSON object."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": format_rfc3339(utc_now()),
            "level": record.levelname.lower(),
            "msg": record.getMessage(),
            "logger": record.name,
        }
        instance_id = logged_instance_id()
        if instance_id:
            line["instance_id"] = instance_id
        line.update(log_context.get())
        for name in CONTEXT_FIELDS:
            value = getattr(record, name, None)
            if value is not None:
                line[name] = value
        if record.exc_info:
            line["error"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


def configure_logging(log_format: str, level: str, *, keep_recent: bool = False) -> None:
    """Install the root handler once for the process; with `keep_recent` (a server), the log ring too."""
    use_json = log_format == "json" or (log_format == "auto" and not sys.stdout.isatty())
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(
        JsonFormatter() if use_json else logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    if (
        keep_recent
    ):  # the support bundle's recent logs (docs/design/admin.md §8.1): JSON, whatever stdout shows
        ring = log_ring()
        ring.setFormatter(JsonFormatter())
        root.handlers.append(ring)
    root.setLevel(level.upper())
    for noisy in ("uvicorn.access", "alembic.runtime.migration"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
