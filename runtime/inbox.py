"""The engine inbox's commands: callers' threads put them, only the engine thread applies them
(between steps), so the scheduler's state has exactly one writer."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .io_struct import GenerateRequest
    from .scheduler.req import Req

Event = tuple[int, dict[str, Any], bool]  # (item index, output dict, is_final)


@dataclass(slots=True)
class AddRequests:
    """Queue one /generate call's requests; each event about them goes to `sink`."""

    request: GenerateRequest
    reqs: list[Req]
    sink: Callable[[Event], None]


@dataclass(slots=True)
class AbortRequest:
    rid: str
    message: str


@dataclass(slots=True)
class CallOnEngine:
    """Run `fn` on the engine thread; `reply` gets (True, result) or (False, exception)."""

    fn: Callable[[], Any]
    reply: Callable[[tuple[bool, Any]], None]


@dataclass(slots=True)
class Stop:
    """Abort what still runs and end the engine thread."""


Command = AddRequests | AbortRequest | CallOnEngine | Stop
