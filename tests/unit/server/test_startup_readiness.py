"""`/ready`'s start-up check (`StartupState.readiness`): ready only once every start-up hook ran."""

from conveyor.runtime.boot import identity_wait_detail
from conveyor.server.startup import StartupState


def test_a_prepared_database_is_not_ready_until_the_hooks_ran() -> None:
    state = StartupState(done=True, detail="recovery finished")
    assert state.readiness() == (False, "starting the node's services")
    state.started = True
    assert state.readiness() == (True, "recovery finished")


def test_a_hook_waiting_behind_the_open_listener_names_its_wait() -> None:
    state = StartupState(done=True, detail="recovery finished")
    wait = identity_wait_detail("duplicate instance_id node-1: another process with this id is beating", 30)
    state.listen_while(wait)
    assert state.listen.is_set()
    assert state.readiness() == (False, wait)
    assert wait.startswith(
        "identity: waiting for the previous instance's heartbeat to go stale (at most 30 s"
    )


def test_a_fatal_start_up_reports_its_message() -> None:
    state = StartupState(
        done=False, detail="the blob store cannot be used: x", fatal="the blob store cannot be used: x"
    )
    assert state.readiness() == (False, "the blob store cannot be used: x")


def test_an_unprepared_database_reports_why() -> None:
    state = StartupState(detail="waiting for the database: refused")
    assert state.readiness() == (False, "waiting for the database: refused")
