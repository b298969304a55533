"""The RBAC table of docs/design/admin.md §3, as data."""

from conveyor.model.permissions import PERMISSIONS, ROLE_PERMISSIONS, role_allows


def test_role_permission_counts_match_the_design() -> None:
    counts = {role: len(perms) for role, perms in ROLE_PERMISSIONS.items()}
    assert counts == {"owner": 35, "admin": 33, "operator": 23, "auditor": 15}
    assert ROLE_PERMISSIONS["owner"] == PERMISSIONS


def test_admin_lacks_only_token_minting_and_key_rotation() -> None:
    assert PERMISSIONS - ROLE_PERMISSIONS["admin"] == {"token.manage", "secret.rotate_key"}


def test_auditor_reads_metadata_never_payloads() -> None:
    assert role_allows("auditor", "run.read")
    assert role_allows("auditor", "access_log.read")
    assert not role_allows("auditor", "event.read_payload")
    assert not role_allows("auditor", "run.cancel")


def test_operator_changes_no_configuration() -> None:
    writes = {"cluster_settings.write", "org_settings.write", "secret.write", "source.manage", "token.manage"}
    assert not writes & ROLE_PERMISSIONS["operator"]
    assert not role_allows("operator", "access_log.read")


def test_unknown_role_holds_nothing() -> None:
    assert not role_allows("root", "run.read")


def test_approving_a_held_job_is_for_owners_admins_and_operators() -> None:
    # docs/design/approvals.md §3: an auditor reads, it never releases a deploy.
    assert [r for r in ("owner", "admin", "operator", "auditor") if role_allows(r, "run.approve")] == [
        "owner",
        "admin",
        "operator",
    ]
