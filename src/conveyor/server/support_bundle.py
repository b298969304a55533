"""The pure parts of a support bundle (docs/design/admin.md §8.1): redaction, size bounds, the per-node
outcomes of the manifest, and the tar stream the route writes.

A node builds its files, then `NodeRedactor.redact` masks them before they leave it, and `bound_part`
keeps them within the size the bundle promises; the coordinator writes each node's files with
`TarStream` as they arrive, and the manifest last.
"""

from __future__ import annotations

import io
import json
import re
import tarfile
import time
from collections.abc import Iterable, Mapping
from typing import Any, Literal
from urllib.parse import urlsplit, urlunsplit

from conveyor.model.masking import Masker
from conveyor.model.redact import REDACTED

LOG_FILE = "logs.jsonl"
FILE_CAP_BYTES = 256 * 1024
LOG_BYTES_DEFAULT = 1024 * 1024
LOG_BYTES_MIN, LOG_BYTES_MAX = 1024, 4 * 1024 * 1024
# What a node's answer leaves free of its peer frame, for the envelope and the encryption.
FRAME_MARGIN_BYTES = 64 * 1024
FORMAT = 1

NodeOutcome = Literal["collected", "refused", "unreachable"]

# A setting whose name holds one of these is a secret (a `*_file` setting names a file: shown).
_SECRET_NAME = re.compile(r"secret|token|password|passwd|key|credential", re.IGNORECASE)
# Conveyor's bearer credentials: a known prefix and a body of URL-safe characters.
_TOKEN = re.compile(r"\b(cvy_(?:admin|agent|join|job|claim)_)[A-Za-z0-9_\-=]+")
_BEARER = re.compile(r"(\bBearer\s+)[^\s\"',;]+", re.IGNORECASE)


def is_secret_setting(name: str) -> bool:
    """Whether a setting's value is a secret by its name (`secret_key`, `metrics_token`, …)."""
    return bool(_SECRET_NAME.search(name)) and not name.endswith("_file")


def redact_url(value: str) -> str:
    """A URL with its password (`user:password@`) replaced; anything else unchanged."""
    try:
        parts = urlsplit(value)
    except ValueError:
        return value
    if not parts.scheme or parts.password is None:
        return value
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    port = f":{parts.port}" if parts.port is not None else ""
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:{REDACTED}@{host}{port}"))


def redact_settings(values: Mapping[str, Any]) -> dict[str, Any]:
    """Settings as a bundle shows them: secret ones `[redacted]` when set, URL passwords hidden."""
    shown: dict[str, Any] = {}
    for name, value in values.items():
        if isinstance(value, str) and value and is_secret_setting(name):
            shown[name] = REDACTED
        elif isinstance(value, str) and "://" in value:
            shown[name] = redact_url(value)
        elif isinstance(value, Mapping):
            shown[name] = redact_settings(value)
        else:
            shown[name] = value
    return shown


def secret_setting_values(values: Mapping[str, Any]) -> list[str]:
    """The values the redactor masks wherever they appear: every set secret setting, and URL passwords."""
    found: list[str] = []
    for name, value in values.items():
        if isinstance(value, Mapping):
            found += secret_setting_values(value)
        elif not isinstance(value, str) or not value:
            continue
        elif is_secret_setting(name):
            found.append(value)
        elif "://" in value:
            try:
                password = urlsplit(value).password
            except ValueError:
                password = None
            if password:
                found.append(password)
    return found


class NodeRedactor:
    """Masks a node's files before they leave it: its known secret values (and their encodings), then
    anything shaped like a Conveyor token or a bearer credential."""

    def __init__(self, secret_values: Iterable[str]) -> None:
        self.masker = Masker(value for value in secret_values if value)

    def text(self, text: str) -> str:
        """`text` with every known secret and token-shaped string replaced."""
        masked = self.masker.mask(text)
        masked = _TOKEN.sub(lambda m: m.group(1) + REDACTED, masked)
        return _BEARER.sub(lambda m: m.group(1) + REDACTED, masked)

    def redact(self, files: Mapping[str, str]) -> dict[str, str]:
        """Every file masked (the log line by line: no secret pattern spans a newline)."""
        return {name: self.text(content) for name, content in files.items()}


def cap_text(text: str, cap: int = FILE_CAP_BYTES) -> str:
    """`text` cut to at most about `cap` UTF-8 bytes, ending in a `[truncated: N bytes]` line when cut."""
    data = text.encode("utf-8")
    if len(data) <= cap:
        return text
    kept = data[:cap].decode("utf-8", errors="ignore")
    return f"{kept}\n[truncated: {len(data) - len(kept.encode('utf-8'))} bytes]\n"


def newest_lines(lines: Iterable[str], budget: int) -> list[str]:
    """The newest whole lines (oldest first) whose encoded size, one JSON string each, stays within
    `budget` bytes: what a node can send of its log ring."""
    kept: list[str] = []
    used = 0
    for line in reversed(list(lines)):
        size = len(json.dumps(line)) + 1
        if used + size > budget:
            break
        kept.append(line)
        used += size
    kept.reverse()
    return kept


def bound_part(
    files: Mapping[str, str], log_lines: Iterable[str], *, log_bytes: int, frame_bytes: int
) -> dict[str, str]:
    """A node's files within the bundle's bounds: each file but the log cut at `FILE_CAP_BYTES`, the log
    the newest lines within `log_bytes`, and the whole (as JSON) within one peer frame of `frame_bytes`."""
    bounded = {name: cap_text(content) for name, content in files.items() if name != LOG_FILE}
    others = sum(len(json.dumps(name)) + len(json.dumps(content)) + 2 for name, content in bounded.items())
    room = max(0, frame_bytes - FRAME_MARGIN_BYTES - others)
    lines = newest_lines(log_lines, min(log_bytes, room))
    bounded[LOG_FILE] = "".join(line + "\n" for line in lines)
    return bounded


def node_entry(
    node: str, role: str | None, outcome: NodeOutcome, detail: str, files: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """One node's line of the manifest."""
    files = files or {}
    return {
        "node": node,
        "role": role,
        "outcome": outcome,
        "detail": detail,
        "files": sorted(files),
        "bytes": sum(len(content.encode("utf-8")) for content in files.values()),
    }


def manifest(
    *, created_at: str, target: str | None, log_bytes: int, me: str, entries: Iterable[dict[str, Any]]
) -> dict[str, Any]:
    """The bundle's `manifest.json`: this node first, then the others by instance id."""
    ordered = sorted(entries, key=lambda e: (e["node"] != me, e["node"]))
    return {
        "format": FORMAT,
        "created_at": created_at,
        "target": target,
        "log_bytes": log_bytes,
        "nodes": ordered,
    }


def json_file(value: Any) -> str:
    """A bundle file's JSON text."""
    return json.dumps(value, indent=2, sort_keys=True, default=str) + "\n"


class _Sink(io.RawIOBase):
    """Where the tar stream writes; the route takes what accumulated after each member."""

    def __init__(self) -> None:
        self.chunks: list[bytes] = []

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        chunk = bytes(data)
        self.chunks.append(chunk)
        return len(chunk)


class TarStream:
    """A gzip-compressed tar archive written member by member; `take()` returns the bytes ready so far."""

    def __init__(self, clock: Any = time.time) -> None:
        self._sink = _Sink()
        self._tar = tarfile.open(fileobj=self._sink, mode="w|gz")
        self._clock = clock

    def add(self, name: str, content: str) -> None:
        """Append one file."""
        data = content.encode("utf-8")
        info = tarfile.TarInfo(name)
        info.size = len(data)
        info.mtime = int(self._clock())
        info.mode = 0o644
        self._tar.addfile(info, io.BytesIO(data))

    def take(self) -> bytes:
        """The compressed bytes written since the last call."""
        chunks, self._sink.chunks = self._sink.chunks, []
        return b"".join(chunks)

    def close(self) -> bytes:
        """End the archive; its last bytes."""
        self._tar.close()
        return self.take()
