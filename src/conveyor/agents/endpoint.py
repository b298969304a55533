"""`GET /ws`: the agent WebSocket endpoint (authenticated by the agent token in `auth.request`)."""

from __future__ import annotations

from fastapi import APIRouter, WebSocket

from conveyor.agents.hub import AGENT_HUB
from conveyor.http.parts import parts_of

router = APIRouter()


@router.websocket("/ws")
async def agent_socket(websocket: WebSocket) -> None:
    """Hand the connection to this node's agent hub."""
    hub = parts_of(websocket).get(AGENT_HUB)
    if hub is None:
        await websocket.close(code=1013, reason="not ready")
        return
    await hub.serve(websocket)
