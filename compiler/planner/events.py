"""Turn lifetimes into an ordered stream of alloc/free events, and the peak they imply.

The peak of simultaneously live bytes is a lower bound for any allocator; the layout map
reports it beside the arena the allocator actually produced.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from .liveness import Lifetime


class EventKind(Enum):
    ALLOC = 0
    FREE = 1


@dataclass(frozen=True)
class Event:
    op: int  # allocation happens before op runs; a free after it
    kind: EventKind
    lifetime: Lifetime


def events(lts: list[Lifetime]) -> list[Event]:
    evs = [Event(lt.first, EventKind.ALLOC, lt) for lt in lts]
    evs += [Event(lt.last, EventKind.FREE, lt) for lt in lts]
    # At one op, allocations precede frees: an op's inputs and outputs are live together.
    return sorted(evs, key=lambda e: (e.op, e.kind.value, e.lifetime.value.name))


def peak_live_bytes(evs: list[Event], size_of) -> int:
    live = peak = 0
    for e in evs:
        live += size_of(e.lifetime) if e.kind is EventKind.ALLOC else -size_of(e.lifetime)
        peak = max(peak, live)
    return peak
