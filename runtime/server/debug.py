"""Debug routes, admin only (auth.py): the KV memory's state (always on, read-only) and the
test-only fault switches (404 unless the engine runs with enable_fault_injection;
runtime/faults.py)."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, ConfigDict

from ..faults import FAULT_KINDS
from .auth import require_admin
from .errors import ERROR_RESPONSES, APIError
from .routes import get_state

router = APIRouter(
    prefix="/debug",
    tags=["debug"],
    responses=ERROR_RESPONSES,
    dependencies=[Depends(require_admin)],
)


class FaultIn(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    kind: str
    count: int = 1


@router.get("/memory")
async def memory(request: Request) -> dict[str, Any]:
    """KV slots by owner (free + evictable + locked + private == capacity), request rows,
    queue lengths, and whether that invariant holds between steps."""
    state = get_state(request)
    return await asyncio.to_thread(state.engine.memory_state) | {"active": len(state.active)}


@router.post("/inject_fault")
async def inject_fault(body: FaultIn, request: Request) -> dict[str, Any]:
    """Arm a fault switch (kinds: forward_error, compile_kill, compile_hang)."""
    engine = get_state(request).engine
    if not engine.faults.enabled:
        raise APIError(404, "fault injection is off (stemma serve --enable-fault-injection)")
    if body.kind not in FAULT_KINDS:
        raise APIError(400, f"unknown fault {body.kind!r}; known: {', '.join(FAULT_KINDS)}", "kind")
    if body.count < 1:
        raise APIError(400, f"count must be >= 1, got {body.count}", "count")
    return engine.inject_fault(body.kind, body.count)
