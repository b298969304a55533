"""The one scope check of an admin caller (`conveyor.http.Principal`, issue 37)."""

from __future__ import annotations

import pytest

from conveyor.http import Principal
from conveyor.model.errors import ApiError

ORG_WIDE = Principal(token_id="t1", label=None, role="admin", routing_key=None)
SCOPED = Principal(token_id="t2", label=None, role="operator", routing_key="github:acme/app")


def test_an_org_wide_token_sees_every_key_and_lists_what_it_asks_for() -> None:
    assert ORG_WIDE.may_see("github:acme/app") and ORG_WIDE.may_see(None)
    assert ORG_WIDE.scope_filter(None) is None
    assert ORG_WIDE.scope_filter("local:other") == "local:other"


def test_a_scoped_token_sees_and_lists_its_own_key_alone() -> None:
    assert SCOPED.may_see("github:acme/app")
    assert not SCOPED.may_see("github:acme/other") and not SCOPED.may_see(None)
    assert SCOPED.scope_filter(None) == "github:acme/app"
    assert SCOPED.scope_filter("github:acme/app") == "github:acme/app"
    with pytest.raises(ApiError) as refused:
        SCOPED.scope_filter("github:acme/other", "emit for")
    assert refused.value.status == 403 and refused.value.code == "token_scope"
    assert "may only emit for github:acme/app" in refused.value.detail


def test_an_action_on_a_key_is_refused_to_a_token_scoped_to_another() -> None:
    ORG_WIDE.check_key("github:acme/other", "manage")
    SCOPED.check_key("github:acme/app", "manage")
    for other in ("github:acme/other", None):
        with pytest.raises(ApiError) as refused:
            SCOPED.check_key(other, "grant into")
        assert refused.value.status == 403 and "may only grant into github:acme/app" in refused.value.detail
