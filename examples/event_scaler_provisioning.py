"""Provisioning for an `event` scaler (docs/scaler.md): machines in a cloud Conveyor has no backend for.

The scaler emits `conveyor.scaler.scale_up` when a job needs a machine with its labels; this workflow
asks the cloud's HTTP API for a machine that runs `conveyor agent --claim CODE --url URL` at boot.
`conveyor.scaler.scale_down` deletes the machine once its agent is done. The jobs run on an ordinary
agent carrying the scaler's `provisioning_label` (`provisioner` here), never on the machines they make.

Org secrets: `CLOUD_API_URL` (the cloud's API base) and `CLOUD_API_TOKEN` (its bearer token).
"""

import json
import urllib.request

from conveyor import event, workflow

provision = workflow("provision-cloud-agent", on=[event("conveyor.scaler.scale_up")])
deprovision = workflow("deprovision-cloud-agent", on=[event("conveyor.scaler.scale_down")])


def cloud(ctx, method, path, body=None):
    """One call to the cloud API; raises on an HTTP error, so the job fails visibly."""
    request = urllib.request.Request(
        ctx.secrets.get("CLOUD_API_URL").rstrip("/") + path,
        data=None if body is None else json.dumps(body).encode(),
        method=method,
        headers={
            "Authorization": "Bearer " + ctx.secrets.get("CLOUD_API_TOKEN"),
            "Content-Type": "application/json",
        },
    )
    with urllib.request.urlopen(request, timeout=60) as answer:
        return json.loads(answer.read() or b"null")


@provision.job(runs_on=["provisioner"], checkout=False, timeout="10m")
def create_machine(ctx):
    wanted = ctx.event.payload
    machine = cloud(
        ctx,
        "POST",
        "/machines",
        {
            "name": "conveyor-" + wanted["agent_id"],
            "labels": wanted["labels"],
            # What the machine runs at boot; the code is single use and expires at claim_expires_at.
            "agent_command": [
                "conveyor",
                "agent",
                "--claim",
                wanted["claim_code"],
                "--url",
                wanted["orchestrator_url"],
            ],
        },
    )
    print("machine", machine["id"], "for agent", wanted["agent_id"])


@deprovision.job(runs_on=["provisioner"], checkout=False, timeout="10m")
def delete_machine(ctx):
    cloud(ctx, "DELETE", "/machines/conveyor-" + ctx.event.payload["agent_id"])
    print("deleted the machine of agent", ctx.event.payload["agent_id"], "-", ctx.event.payload["reason"])
