"""Lifetimes of the activation arena's buffers: [first op that touches it, last op that reads it].

Graph inputs are live from op 0. Graph outputs (logits) are written into the caller's
buffer, so they take no arena space.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..ir.graph import Graph, Value, ValueKind

ARENA_KINDS = (ValueKind.INPUT, ValueKind.ACTIVATION)


@dataclass(frozen=True)
class Lifetime:
    value: Value
    first: int
    last: int

    def overlaps(self, other: "Lifetime") -> bool:
        return self.first <= other.last and other.first <= self.last


def lifetimes(g: Graph) -> list[Lifetime]:
    first: dict[str, int] = {v.name: 0 for v in g.inputs}
    last: dict[str, int] = {v.name: 0 for v in g.inputs}
    values: dict[str, Value] = {v.name: v for v in g.inputs}
    for i, n in enumerate(g.nodes):
        for v in n.outputs:
            if v.kind in ARENA_KINDS:
                values[v.name] = v
                first[v.name] = last[v.name] = i
        for v in n.inputs:
            if v.kind in ARENA_KINDS:
                last[v.name] = i
        if n.scratch is not None:
            values[n.scratch.name] = n.scratch
            first[n.scratch.name] = last[n.scratch.name] = i
    return [Lifetime(values[name], first[name], last[name]) for name in values]
