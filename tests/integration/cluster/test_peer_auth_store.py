"""Join tokens and credentials against both databases (docs/design/cluster.md §2.2)."""

import hashlib
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import insert, select, update
from sqlalchemy.exc import IntegrityError

from conveyor.cluster import store
from conveyor.cluster.auth import (
    AuthThrottle,
    PeerAuthenticator,
    credential_keys,
    decode_bytes,
    encode_bytes,
    hash_join_token,
    load_credential,
    make_proof,
    new_join_token,
    self_enrol,
)
from conveyor.cluster.messages import AuthRequest
from conveyor.db.engine import Database
from conveyor.db.tables import join_tokens, peer_credentials
from conveyor.model.ids import new_id, utc_now

TH = hashlib.sha256(b"session").digest()


async def make_token(
    db: Database, *, role: str = "worker", expires_in: timedelta = timedelta(hours=1)
) -> str:
    token = new_join_token()
    async with db.transaction() as conn:
        now = await store.database_now(conn)
        await store.insert_join_token(
            conn,
            token_hash=hash_join_token(token),
            role=role,
            created_by="test",
            now=now,
            expires_at=now + expires_in,
        )
    return token


def join(instance_id: str, token: str) -> AuthRequest:
    return AuthRequest(instance_id=instance_id, software_version="1", join_token=token)


def prove(instance_id: str, secret: bytes, th: bytes = TH, *, client_key: bytes | None = None) -> AuthRequest:
    keys = credential_keys(secret, instance_id)
    proof = make_proof(client_key or keys.client_key, keys.stored_key, th, instance_id)
    return AuthRequest(instance_id=instance_id, software_version="1", proof=encode_bytes(proof))


def authenticator(db: Database) -> PeerAuthenticator:
    return PeerAuthenticator(db, me="coordinator-1")


async def test_a_join_token_issues_a_credential_whose_role_comes_from_the_token(database: Database) -> None:
    token = await make_token(database, role="worker")
    outcome = await authenticator(database).authenticate(join("w1", token), th=TH, remote="127.0.0.1")
    assert outcome.accepted and outcome.role == "worker" and outcome.issued is not None
    secret = decode_bytes(outcome.issued.secret)
    assert secret is not None and len(secret) == 32
    async with database.read() as conn:
        row = await store.latest_credential(conn, "w1")
        consumed = (await conn.execute(select(join_tokens))).one()
    assert row is not None and row.role == "worker"
    assert row.stored_key == credential_keys(secret, "w1").stored_key
    assert row.server_key == credential_keys(secret, "w1").server_key
    assert consumed.consumed_by_instance == "w1" and consumed.consumed_at is not None


async def test_only_the_verifier_is_stored_never_the_secret_or_client_key(database: Database) -> None:
    token = await make_token(database)
    outcome = await authenticator(database).authenticate(join("w1", token), th=TH, remote=None)
    secret = decode_bytes(outcome.issued.secret)  # type: ignore[union-attr]
    assert secret is not None
    async with database.read() as conn:
        row = (await conn.execute(select(peer_credentials))).one()
    stored = {bytes(v) for v in row._mapping.values() if isinstance(v, bytes | memoryview)}
    assert secret not in stored and credential_keys(secret, "w1").client_key not in stored


async def test_a_second_instance_with_the_same_token_gets_token_used(database: Database) -> None:
    token = await make_token(database)
    auth = authenticator(database)
    assert (await auth.authenticate(join("a", token), th=TH, remote=None)).accepted
    refused = await auth.authenticate(join("b", token), th=TH, remote=None)
    assert (refused.accepted, refused.reason, refused.close_code) == (False, "token_used", 4401)


async def test_expired_unknown_and_revoked_tokens_name_their_reason(database: Database) -> None:
    expired = await make_token(database, expires_in=timedelta(milliseconds=-1))
    revoked = await make_token(database)
    async with database.transaction() as conn:
        await conn.execute(
            update(join_tokens)
            .where(join_tokens.c.token_hash == hash_join_token(revoked))
            .values(revoked_at=utc_now())
        )
    auth = authenticator(database)
    assert (await auth.authenticate(join("a", expired), th=TH, remote=None)).reason == "token_expired"
    assert (await auth.authenticate(join("a", revoked), th=TH, remote=None)).reason == "token_revoked"
    assert (
        await auth.authenticate(join("a", new_join_token()), th=TH, remote=None)
    ).reason == "token_unknown"


async def test_a_used_token_replayed_under_a_live_workers_id_from_another_address_is_refused(
    database: Database,
) -> None:
    token = await make_token(database)
    auth = authenticator(database)
    first = await auth.authenticate(join("w1", token), th=TH, remote="10.0.0.1")
    assert first.accepted and first.issued is not None
    replay = await auth.authenticate(join("w1", token), th=TH, remote="10.0.0.66")
    assert (replay.accepted, replay.reason, replay.close_code) == (False, "token_used", 4401)
    assert replay.issued is None
    async with database.read() as conn:
        rows = list(await conn.execute(select(peer_credentials)))
    assert [(r.id, r.rotated_at, r.revoked_at) for r in rows] == [(first.credential_id, None, None)]
    secret = decode_bytes(first.issued.secret)
    assert secret is not None
    assert (await auth.authenticate(prove("w1", secret), th=TH, remote="10.0.0.1")).accepted


async def test_a_revoked_worker_stays_revoked_when_it_presents_its_used_token_again(
    database: Database,
) -> None:
    token = await make_token(database)
    auth = authenticator(database)
    joined = await auth.authenticate(join("w1", token), th=TH, remote=None)
    assert joined.accepted and joined.issued is not None
    async with database.transaction() as conn:
        assert await store.revoke_credentials(conn, "w1", await store.database_now(conn)) == 1
    again = await auth.authenticate(join("w1", token), th=TH, remote=None)
    assert (again.accepted, again.reason) == (False, "token_used")
    async with database.read() as conn:
        latest = await store.latest_credential(conn, "w1")
    assert latest is not None and latest.id == joined.credential_id and latest.revoked_at is not None
    secret = decode_bytes(joined.issued.secret)
    assert secret is not None
    assert (await auth.authenticate(prove("w1", secret), th=TH, remote=None)).reason == "credential_revoked"
    # Only an operator's new token lets it back.
    readmitted = await auth.authenticate(join("w1", await make_token(database)), th=TH, remote=None)
    assert readmitted.accepted and readmitted.credential_id != joined.credential_id


async def test_a_fresh_token_never_replaces_a_live_credential_and_stays_unused(database: Database) -> None:
    auth = authenticator(database)
    joined = await auth.authenticate(join("w1", await make_token(database)), th=TH, remote=None)
    assert joined.accepted and joined.issued is not None
    second = await make_token(database)
    impostor = await auth.authenticate(join("w1", second), th=TH, remote="10.0.0.66")
    assert (impostor.accepted, impostor.reason, impostor.close_code) == (False, "instance_enrolled", 4401)
    secret = decode_bytes(joined.issued.secret)
    assert secret is not None
    assert (await auth.authenticate(prove("w1", secret), th=TH, remote=None)).accepted
    # The refused token was not spent: the worker it was made for can still join with it.
    assert (await auth.authenticate(join("w2", second), th=TH, remote=None)).accepted


async def test_a_proof_from_the_real_secret_succeeds_and_is_recorded_with_the_row_role(
    database: Database,
) -> None:
    token = await make_token(database, role="coordinator")
    auth = authenticator(database)
    issued = (await auth.authenticate(join("c2", token), th=TH, remote=None)).issued
    secret = decode_bytes(issued.secret)  # type: ignore[union-attr]
    assert secret is not None
    outcome = await auth.authenticate(prove("c2", secret), th=TH, remote=None)
    assert outcome.accepted and outcome.role == "coordinator" and outcome.server_signature
    async with database.read() as conn:
        row = await store.latest_credential(conn, "c2")
    assert row is not None and row.last_validated_by == "coordinator-1"


async def test_proofs_built_from_a_leaked_stored_key_or_server_key_fail(database: Database) -> None:
    token = await make_token(database)
    auth = authenticator(database)
    await auth.authenticate(join("w1", token), th=TH, remote=None)
    async with database.read() as conn:
        row = (await conn.execute(select(peer_credentials))).one()
    for leaked in (bytes(row.stored_key), bytes(row.server_key)):
        outcome = await auth.authenticate(prove("w1", b"x" * 32, client_key=leaked), th=TH, remote=None)
        assert (outcome.accepted, outcome.reason) == (False, "proof_invalid")


async def test_a_revoked_credential_is_refused_with_credential_revoked(database: Database) -> None:
    token = await make_token(database)
    auth = authenticator(database)
    secret = decode_bytes((await auth.authenticate(join("w1", token), th=TH, remote=None)).issued.secret)  # type: ignore[union-attr]
    assert secret is not None
    async with database.transaction() as conn:
        assert await store.revoke_credentials(conn, "w1", await store.database_now(conn)) == 1
    outcome = await auth.authenticate(prove("w1", secret), th=TH, remote=None)
    assert (outcome.reason, outcome.close_code) == ("credential_revoked", 4401)


async def test_an_unknown_instance_is_refused(database: Database) -> None:
    outcome = await authenticator(database).authenticate(prove("ghost", b"s" * 32), th=TH, remote=None)
    assert outcome.reason == "credential_unknown"


async def joined_secret(database: Database, auth: PeerAuthenticator, instance_id: str) -> bytes:
    outcome = await auth.authenticate(join(instance_id, await make_token(database)), th=TH, remote="10.0.0.1")
    secret = decode_bytes(outcome.issued.secret)  # type: ignore[union-attr]
    assert secret is not None
    return secret


async def test_the_sixth_failure_from_one_address_in_a_window_is_throttled_even_with_a_good_proof(
    database: Database,
) -> None:
    auth = PeerAuthenticator(database, me="c", throttle=AuthThrottle())
    secret = await joined_secret(database, auth, "w1")
    for _ in range(5):
        await auth.authenticate(prove("w1", b"wrong" * 8), th=TH, remote="10.0.0.66")
    outcome = await auth.authenticate(prove("w1", secret), th=TH, remote="10.0.0.66")
    assert (outcome.accepted, outcome.reason, outcome.close_code) == (False, "throttled", 4429)


async def test_bad_proofs_under_a_workers_id_from_any_address_never_lock_the_worker_out(
    database: Database,
) -> None:
    auth = PeerAuthenticator(database, me="c", throttle=AuthThrottle())
    secret = await joined_secret(database, auth, "w1")
    for round_ in range(2):  # repeatably, not just once
        for attacker in range(6):
            refused = await auth.authenticate(
                prove("w1", b"wrong" * 8), th=TH, remote=f"10.0.{round_}.{attacker % 2 + 100}"
            )
            assert not refused.accepted
        assert (await auth.authenticate(prove("w1", secret), th=TH, remote="10.0.0.1")).accepted


async def test_failures_of_a_peer_holding_the_secret_throttle_its_instance_id_from_every_address(
    database: Database,
) -> None:
    auth = PeerAuthenticator(database, me="c", throttle=AuthThrottle())
    secret = await joined_secret(database, auth, "w1")
    async with database.transaction() as conn:
        await store.revoke_credentials(conn, "w1", await store.database_now(conn))
    for address in range(5):
        outcome = await auth.authenticate(prove("w1", secret), th=TH, remote=f"10.0.1.{address}")
        assert outcome.reason == "credential_revoked"
    outcome = await auth.authenticate(prove("w1", secret), th=TH, remote="10.0.2.1")
    assert (outcome.reason, outcome.close_code) == ("throttled", 4429)


async def test_one_active_credential_per_instance_is_enforced_by_the_database(database: Database) -> None:
    now = utc_now()
    row = dict(
        instance_id="w1",
        role="worker",
        stored_key=b"s",
        server_key=b"k",
        created_at=now,
        expires_at=now + timedelta(days=1),
    )
    async with database.transaction() as conn:
        await conn.execute(insert(peer_credentials).values(id=new_id(), **row))
    with pytest.raises(IntegrityError):
        async with database.transaction() as conn:
            await conn.execute(insert(peer_credentials).values(id=new_id(), **row))
    async with database.transaction() as conn:  # a revoked or rotated row does not count
        await conn.execute(insert(peer_credentials).values(id=new_id(), revoked_at=now, **row))


async def test_a_coordinator_self_enrols_once_and_keeps_a_valid_saved_credential(
    database: Database, tmp_path: Path
) -> None:
    first = await self_enrol(database, tmp_path, "c1")
    assert load_credential(tmp_path, "c1") == first
    again = await self_enrol(database, tmp_path, "c1")
    assert again == first
    async with database.read() as conn:
        row = await store.latest_credential(conn, "c1")
        count = len((await conn.execute(select(peer_credentials))).all())
    assert row is not None and row.role == "coordinator" and count == 1
    outcome = await authenticator(database).authenticate(prove("c1", first.secret_bytes), th=TH, remote=None)
    assert outcome.accepted and outcome.role == "coordinator"


async def test_a_revoked_coordinator_enrols_again_at_its_next_boot(
    database: Database, tmp_path: Path
) -> None:
    first = await self_enrol(database, tmp_path, "c1")
    async with database.transaction() as conn:
        await store.revoke_credentials(conn, "c1", await store.database_now(conn))
    second = await self_enrol(database, tmp_path, "c1")
    assert second.secret != first.secret
    outcome = await authenticator(database).authenticate(prove("c1", second.secret_bytes), th=TH, remote=None)
    assert outcome.accepted


async def test_a_rotation_swaps_the_active_row_but_never_revives_a_revoked_or_superseded_one(
    database: Database,
) -> None:
    token = await make_token(database)
    outcome = await authenticator(database).authenticate(join("w1", token), th=TH, remote=None)
    keys = credential_keys(b"n" * 32, "w1")

    async def rotate(previous_id: str) -> str | None:
        async with database.transaction() as conn:
            now = await store.database_now(conn)
            return await store.rotate_credential(
                conn,
                previous_id=previous_id,
                instance_id="w1",
                role="worker",
                stored_key=keys.stored_key,
                server_key=keys.server_key,
                now=now,
                expires_at=now + timedelta(days=90),
                validated_by="c1",
            )

    assert outcome.credential_id is not None
    new_id = await rotate(outcome.credential_id)
    assert new_id is not None
    assert await rotate(outcome.credential_id) is None  # already superseded
    async with database.transaction() as conn:
        await store.revoke_credentials(conn, "w1", await store.database_now(conn))
    assert await rotate(new_id) is None  # revoked meanwhile
    async with database.read() as conn:
        latest = await store.latest_credential(conn, "w1")
    assert latest is not None and latest.id == new_id and latest.revoked_at is not None


async def test_pruning_deletes_only_join_tokens_expired_before_the_cutoff(database: Database) -> None:
    old = await make_token(database, expires_in=timedelta(days=-2))
    recent = await make_token(database, expires_in=timedelta(hours=-1))
    live = await make_token(database)
    async with database.transaction() as conn:
        now = await store.database_now(conn)
        assert await store.prune_join_tokens(conn, now - timedelta(days=1)) == 1
    async with database.read() as conn:
        left = {r.token_hash for r in await conn.execute(select(join_tokens.c.token_hash))}
    assert left == {hash_join_token(recent), hash_join_token(live)} and hash_join_token(old) not in left
