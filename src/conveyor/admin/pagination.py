"""Keyset pagination shared by every admin list (docs/design/admin.md §1).

Newest first by `(created_at, id)`; the cursor is opaque base64url JSON carrying the last row's key
and a hash of the filters, so a cursor reused with other filters is refused rather than misread.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import Column, Select, and_, or_

from conveyor.model.errors import ApiError

DEFAULT_LIMIT = 50
MAX_LIMIT = 500


def filters_hash(filters: Mapping[str, Any]) -> str:
    """SHA-256 of the canonical JSON of the filters that are set."""
    canonical = json.dumps({k: v for k, v in filters.items() if v is not None}, sort_keys=True, default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


def encode_cursor(at: datetime, row_id: str, filters: Mapping[str, Any]) -> str:
    """The cursor pointing after the row `(at, row_id)`."""
    payload = {"v": 1, "at": at.isoformat(), "id": row_id, "f": filters_hash(filters)}
    return base64.urlsafe_b64encode(json.dumps(payload, separators=(",", ":")).encode()).decode().rstrip("=")


def decode_cursor(cursor: str, filters: Mapping[str, Any]) -> tuple[datetime, str]:
    """Read a cursor back; 400 `invalid_cursor` if it was tampered with or the filters changed."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        payload = json.loads(raw)
        at = datetime.fromisoformat(payload["at"])
        row_id = str(payload["id"])
        version, fhash = payload["v"], payload["f"]
    except (binascii.Error, ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
        raise ApiError(400, "invalid_cursor", "the cursor is not one this server issued") from exc
    if version != 1 or at.tzinfo is None:
        raise ApiError(400, "invalid_cursor", "the cursor is not one this server issued")
    if fhash != filters_hash(filters):
        raise ApiError(
            400, "invalid_cursor", "the cursor was issued for other filters; start again without it"
        )
    return at, row_id


def check_limit(limit: int) -> int:
    """1–500, else 400 `invalid_request`."""
    if not 1 <= limit <= MAX_LIMIT:
        raise ApiError(400, "invalid_request", f"limit must be between 1 and {MAX_LIMIT}")
    return limit


def keyset_page(
    query: Select[Any],
    at_column: Column[Any],
    id_column: Column[Any],
    *,
    limit: int,
    cursor: str | None,
    filters: Mapping[str, Any],
) -> Select[Any]:
    """Order newest first and continue after the cursor; fetches one extra row to detect a next page."""
    if cursor:
        c_at, c_id = decode_cursor(cursor, filters)
        query = query.where(or_(at_column < c_at, and_(at_column == c_at, id_column < c_id)))
    return query.order_by(at_column.desc(), id_column.desc()).limit(check_limit(limit) + 1)


def next_cursor(rows: list[Any], limit: int, at_key: str, filters: Mapping[str, Any]) -> str | None:
    """Trim the extra row; return the cursor for the next page, or None on the last one."""
    if len(rows) <= limit:
        return None
    del rows[limit:]
    last = rows[-1]._mapping
    return encode_cursor(last[at_key], last["id"], filters)
