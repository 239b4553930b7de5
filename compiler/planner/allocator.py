"""A deterministic offset allocator for buffers with known lifetimes (greedy by size).

Buffers are placed largest first (ties: earlier first op, then name), each at the lowest
64-byte-aligned offset where it overlaps no already-placed buffer that is live at the same
time. The order is a pure function of the graph, so the same graph gives the same offsets.
"""
from __future__ import annotations

from dataclasses import dataclass

from .events import Event, EventKind
from .kv_plan import align
from .liveness import Lifetime


@dataclass(frozen=True)
class Placement:
    lifetime: Lifetime
    offset: int
    size: int  # aligned size reserved in the arena

    @property
    def end(self) -> int:
        return self.offset + self.size


def allocate(evs: list[Event]) -> list[Placement]:
    lts = [e.lifetime for e in evs if e.kind is EventKind.ALLOC]
    order = sorted(lts, key=lambda lt: (-lt.value.nbytes, lt.first, lt.value.name))
    placed: list[Placement] = []
    for lt in order:
        size = align(lt.value.nbytes)
        busy = sorted((p.offset, p.end) for p in placed if p.lifetime.overlaps(lt))
        offset = 0
        for start, end in busy:
            if offset + size <= start:
                break
            offset = max(offset, end)
        placed.append(Placement(lt, offset, size))
    return sorted(placed, key=lambda p: (p.lifetime.first, p.offset, p.lifetime.value.name))


def arena_bytes(placements: list[Placement]) -> int:
    return max((p.end for p in placements), default=0)
