"""Agent tokens in the database: mint, authenticate, consume once, bind, revoke
(docs/design/execution.md §6)."""

import asyncio
from datetime import timedelta

from sqlalchemy import select, update

from conveyor.agents import (
    AgentAuthRefusal,
    AgentTokenRow,
    authenticate_agent_token,
    bind_agent_id,
    mint_agent_token,
)
from conveyor.agents.store import revoke_agent_token
from conveyor.agents.tokens import hash_token
from conveyor.db.engine import Database
from conveyor.db.tables import agent_tokens
from conveyor.model.ids import utc_now


async def mint(database: Database, **options: object) -> tuple[str, AgentTokenRow]:
    async with database.transaction() as conn:
        return await mint_agent_token(
            conn,
            labels=options.pop("labels", ["Linux", "docker", "linux"]),  # type: ignore[arg-type]
            mandatory_labels=[],
            label="ci",
            created_by="test",
            **options,  # type: ignore[arg-type]
        )


async def authenticate(
    database: Database, token: str, now: object = None
) -> AgentTokenRow | AgentAuthRefusal:
    async with database.transaction() as conn:
        return await authenticate_agent_token(conn, token, now or utc_now())  # type: ignore[arg-type]


async def test_a_minted_token_is_stored_as_its_hash_with_normalised_labels(database: Database) -> None:
    plaintext, row = await mint(database)
    async with database.read() as conn:
        stored = (await conn.execute(select(agent_tokens).where(agent_tokens.c.id == row.id))).one()
    assert stored.token_hash == hash_token(plaintext)
    assert plaintext not in {str(v) for v in stored}
    assert stored.prefix == plaintext[:12]
    assert stored.labels == ["docker", "linux"]
    assert (stored.kind, stored.single_use) == ("static", False)


async def test_a_live_token_authenticates_and_records_its_use(database: Database) -> None:
    plaintext, row = await mint(database)
    found = await authenticate(database, plaintext)
    assert isinstance(found, AgentTokenRow) and found.id == row.id
    assert found.last_used_at is not None


async def test_unknown_malformed_revoked_and_expired_tokens_are_refused_with_their_reason(
    database: Database,
) -> None:
    live, _ = await mint(database)
    revoked, revoked_row = await mint(database)
    expired, _ = await mint(database, expires_at=utc_now() - timedelta(seconds=1))
    async with database.transaction() as conn:
        assert await revoke_agent_token(conn, revoked_row.id, utc_now())
    cases = {
        "not-a-token": "unknown_token",
        live[:-1] + ("0" if live[-1] != "0" else "1"): "unknown_token",
        revoked: "revoked",
        expired: "expired",
    }
    for value, reason in cases.items():
        refusal = await authenticate(database, value)
        assert isinstance(refusal, AgentAuthRefusal) and refusal.reason == reason, value


async def test_a_token_expires_at_its_expiry_instant(database: Database) -> None:
    expires_at = utc_now() + timedelta(hours=1)
    plaintext, _ = await mint(database, expires_at=expires_at)
    assert isinstance(
        await authenticate(database, plaintext, expires_at - timedelta(seconds=1)), AgentTokenRow
    )
    refusal = await authenticate(database, plaintext, expires_at)
    assert isinstance(refusal, AgentAuthRefusal) and refusal.reason == "expired"


async def test_a_single_use_token_works_once(database: Database) -> None:
    plaintext, _ = await mint(database, kind="ephemeral", single_use=True, agent_id="agent-7")
    first = await authenticate(database, plaintext)
    assert isinstance(first, AgentTokenRow) and first.consumed_at is not None
    second = await authenticate(database, plaintext)
    assert isinstance(second, AgentAuthRefusal) and second.reason == "consumed"


async def test_two_connections_racing_with_one_single_use_token_let_exactly_one_in(
    database: Database,
) -> None:
    for _ in range(5):
        plaintext, _ = await mint(database, kind="ephemeral", single_use=True)
        outcomes = await asyncio.gather(authenticate(database, plaintext), authenticate(database, plaintext))
        winners = [o for o in outcomes if isinstance(o, AgentTokenRow)]
        losers = [o for o in outcomes if isinstance(o, AgentAuthRefusal)]
        assert len(winners) == 1 and len(losers) == 1
        assert losers[0].reason == "consumed"


async def test_a_token_binds_to_its_first_agent_id_only(database: Database) -> None:
    _, row = await mint(database)
    async with database.transaction() as conn:
        assert await bind_agent_id(conn, row.id, "agent-a", utc_now()) is None
        assert await bind_agent_id(conn, row.id, "agent-a", utc_now()) is None
        assert await bind_agent_id(conn, row.id, "agent-b", utc_now()) is not None
        assert await bind_agent_id(conn, "no-such-token", "agent-c", utc_now()) is not None


async def test_an_ephemeral_token_minted_for_an_agent_refuses_another(database: Database) -> None:
    _, row = await mint(database, kind="ephemeral", single_use=True, agent_id="spawned-1")
    async with database.transaction() as conn:
        assert await bind_agent_id(conn, row.id, "someone-else", utc_now()) is not None
        assert await bind_agent_id(conn, row.id, "spawned-1", utc_now()) is None


async def test_a_second_token_cannot_take_an_agent_id_bound_to_a_live_token(database: Database) -> None:
    _, rightful = await mint(database)
    _, impostor = await mint(database)
    async with database.transaction() as conn:
        assert await bind_agent_id(conn, rightful.id, "builder-1", utc_now()) is None
        refusal = await bind_agent_id(conn, impostor.id, "builder-1", utc_now())
    assert refusal is not None and "builder-1" in refusal.reason and rightful.prefix in refusal.reason
    async with database.read() as conn:
        bound = dict((await conn.execute(select(agent_tokens.c.id, agent_tokens.c.agent_id))).all())
    assert bound == {rightful.id: "builder-1", impostor.id: None}


async def test_a_revoked_or_expired_binding_lets_a_new_token_re_key_the_agent(database: Database) -> None:
    _, old = await mint(database)
    _, new = await mint(database)
    _, newest = await mint(database)
    now = utc_now()
    async with database.transaction() as conn:
        assert await bind_agent_id(conn, old.id, "builder-1", now) is None
        assert await revoke_agent_token(conn, old.id, now)
        assert await bind_agent_id(conn, new.id, "builder-1", now) is None
        # `new` expires: from then on the id is free again for a third token.
        await conn.execute(
            update(agent_tokens)
            .where(agent_tokens.c.id == new.id)
            .values(expires_at=now + timedelta(hours=1))
        )
        assert await bind_agent_id(conn, newest.id, "builder-1", now) is not None
        assert await bind_agent_id(conn, newest.id, "builder-1", now + timedelta(hours=2)) is None


async def test_two_tokens_racing_for_one_unbound_agent_id_bind_exactly_one(database: Database) -> None:
    rows = [(await mint(database))[1] for _ in range(6)]

    async def bind(token_id: str) -> object:
        async with database.transaction() as conn:
            return await bind_agent_id(conn, token_id, "contested", utc_now())

    outcomes = await asyncio.gather(*(bind(row.id) for row in rows))
    assert sum(outcome is None for outcome in outcomes) == 1
    async with database.read() as conn:
        holders = (
            await conn.execute(select(agent_tokens.c.id).where(agent_tokens.c.agent_id == "contested"))
        ).all()
    assert len(holders) == 1


async def test_revoking_twice_reports_the_second_as_no_change(database: Database) -> None:
    _, row = await mint(database)
    async with database.transaction() as conn:
        assert await revoke_agent_token(conn, row.id, utc_now())
        assert not await revoke_agent_token(conn, row.id, utc_now())
