"""An agent id belongs to the live token it is bound to (docs/design/execution.md §6; the hardening issue).

The attack: a second, valid agent token registers under an agent id already bound to another live
token, then reports on that agent's job. It must be refused (4010) and change nothing.
"""

from pathlib import Path

import pytest

from conveyor.model import protocol as p
from tests.support.dispatch_stage import SINGLE_WORKFLOW, Stage, stage
from tests.support.protocol_agent import ScriptedAgent
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow


def token_id_of(s: Stage, plaintext: str) -> str:
    # Not by the listed prefix: two tokens share it in 1 of 256 stages (and then the wrong one was revoked).
    return s.token_ids[plaintext]


async def test_a_second_token_cannot_take_over_a_live_agents_id_or_report_its_job(
    database_url: str, tmp_path: Path
) -> None:
    with stage(tmp_path, database_url, {"ci": SINGLE_WORKFLOW}) as s:
        rightful_token = s.agent_token(["linux"])
        impostor_token = s.agent_token(["linux", "evil"])
        rightful = ScriptedAgent(s.ws_url, rightful_token, agent_id="builder-1", heartbeat_s=1)
        await rightful.connect()
        run_id = s.push()
        dispatch = await rightful.next_of(p.JobDispatch)
        await rightful.accept(dispatch)
        wait_until(lambda: s.job_status(run_id)["build"] == "running", what="build running", timeout=60)

        impostor = ScriptedAgent(s.ws_url, impostor_token, agent_id="builder-1", labels=["linux", "evil"])
        answer, code = await impostor.connect_refused(in_flight=[dispatch.job_id])
        assert isinstance(answer, p.AuthFailure), answer
        assert "builder-1" in answer.reason and "bound to another live token" in answer.reason
        assert code == p.CLOSE_AUTH_FAILED

        # Nothing changed: the rightful agent is still connected, its row keeps its token and labels,
        # its job still runs, and the impostor's token was not bound to the id.
        assert rightful.close_code is None
        agent = s.api("GET", "/agents/builder-1").json()
        assert agent["token_id"] == token_id_of(s, rightful_token)
        assert agent["labels"] == ["linux"] and agent["state"] == "online"
        tokens = {t["id"]: t for t in s.api("GET", "/agent-tokens").json()["items"]}
        assert tokens[token_id_of(s, impostor_token)]["agent_id"] is None
        assert s.job_status(run_id) == {"build": "running"}

        # Under its own id the impostor's reports about the job are refused, never applied.
        intruder = ScriptedAgent(s.ws_url, impostor_token, agent_id="intruder", labels=["linux", "evil"])
        await intruder.connect(in_flight=[dispatch.job_id])
        not_owned = await intruder.next_of(p.JobCancel)
        assert (not_owned.job_id, not_owned.reason) == (dispatch.job_id, "not_owned")
        await intruder.wait_acked(await intruder.step(dispatch.job_id, 1, "build", "failed"))
        await intruder.wait_acked(await intruder.finish(dispatch.job_id, "success"))
        assert s.job_status(run_id) == {"build": "running"}
        assert s.run(run_id)["jobs"][0]["steps"] == []

        # The rightful agent still reports, and its outcome is the one that counts.
        await rightful.wait_acked(await rightful.step(dispatch.job_id, 1, "build", "success", ["ok"]))
        await rightful.wait_acked(await rightful.finish(dispatch.job_id, "success"))
        run = s.wait_run(run_id, "success")
        assert [step["status"] for step in run["jobs"][0]["steps"]] == ["success"]
        await intruder.close()
        await rightful.close()


async def test_revoking_the_bound_token_lets_a_new_token_re_key_the_agent(
    database_url: str, tmp_path: Path
) -> None:
    with stage(tmp_path, database_url, {"ci": SINGLE_WORKFLOW}) as s:
        old_token = s.agent_token(["linux"])
        new_token = s.agent_token(["linux"])
        old = ScriptedAgent(s.ws_url, old_token, agent_id="builder-1")
        await old.connect()
        await old.close()
        refused, _ = await ScriptedAgent(s.ws_url, new_token, agent_id="builder-1").connect_refused()
        assert isinstance(refused, p.AuthFailure)

        assert s.api("DELETE", f"/agent-tokens/{token_id_of(s, old_token)}").status_code == 204
        rekeyed = ScriptedAgent(s.ws_url, new_token, agent_id="builder-1")
        await rekeyed.connect()
        assert s.api("GET", "/agents/builder-1").json()["token_id"] == token_id_of(s, new_token)
        run_id = s.push()
        dispatch = await rekeyed.next_of(p.JobDispatch)
        await rekeyed.accept(dispatch)
        await rekeyed.wait_acked(await rekeyed.finish(dispatch.job_id, "success"))
        s.wait_run(run_id, "success")
        # The old token is refused at authentication; the id stays with the new one.
        answer, code = await ScriptedAgent(s.ws_url, old_token, agent_id="builder-1").connect_refused()
        assert isinstance(answer, p.AuthFailure) and code == p.CLOSE_AUTH_FAILED
        await rekeyed.close()


async def test_a_reconnect_under_the_same_token_keeps_the_agent_online_and_its_job_running(
    database_url: str, tmp_path: Path
) -> None:
    # The older connection's close used to race the new registration: its disconnect handler could
    # mark the agent offline and its running job `recovering` after the new connection registered.
    with stage(tmp_path, database_url, {"ci": SINGLE_WORKFLOW}) as s:
        token = s.agent_token(["linux"])
        first = ScriptedAgent(s.ws_url, token, agent_id="builder-1")
        await first.connect()
        run_id = s.push()
        dispatch = await first.next_of(p.JobDispatch)
        await first.accept(dispatch)
        wait_until(lambda: s.job_status(run_id)["build"] == "running", what="build running", timeout=60)
        current = first
        for _ in range(3):
            newer = ScriptedAgent(s.ws_url, token, agent_id="builder-1")
            await newer.connect(in_flight=[dispatch.job_id])
            assert await current.wait_closed() == p.CLOSE_REPLACED
            # A heartbeat round trip orders us after anything the server does for the old close.
            await newer.send(p.Heartbeat(ts=1.0, running=[dispatch.job_id], free_slots=0))
            await newer.next_of(p.HeartbeatAck)
            assert s.api("GET", "/agents/builder-1").json()["state"] == "online"
            assert s.job_status(run_id) == {"build": "running"}
            current = newer
        await current.wait_acked(await current.finish(dispatch.job_id, "success"))
        s.wait_run(run_id, "success")
        await current.close()
