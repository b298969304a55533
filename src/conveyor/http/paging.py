"""The shape of every paged admin list: `{"items": [...], "next_cursor": ...}` (keyset paging, docs/design/admin.md)."""

from __future__ import annotations

from typing import Generic, TypeVar

from pydantic import BaseModel

Item = TypeVar("Item")


class Page(BaseModel, Generic[Item]):
    """One page of a list; `next_cursor` is null on the last page."""

    items: list[Item]
    next_cursor: str | None = None
