"""Lifetimes of the activation arena's buffers: [first op that touches it, last op that reads it],
over the schedule with the body once (Graph.nodes).

A body value lives within one run of the body, so one run's range is the range of every run.
The state (the residual stream) is carried from layer to layer: it lives for the whole step.
The step's inputs and its logits are the caller's memory and take no arena space.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..ir.graph import ARENA_KINDS, Graph, Value, ValueKind


@dataclass(frozen=True)
class Lifetime:
    value: Value
    first: int
    last: int

    def overlaps(self, other: "Lifetime") -> bool:
        return self.first <= other.last and other.first <= self.last


def lifetimes(g: Graph) -> list[Lifetime]:
    end = len(g.nodes) - 1
    first: dict[str, int] = {v.name: 0 for v in g.state}
    last: dict[str, int] = {v.name: end for v in g.state}
    values: dict[str, Value] = {v.name: v for v in g.state}
    for i, n in enumerate(g.nodes):
        for v in n.outputs:
            if v.kind is ValueKind.ACTIVATION:
                values[v.name] = v
                first[v.name] = last[v.name] = i
        for v in n.inputs:
            if v.kind is ValueKind.ACTIVATION:
                last[v.name] = i
        if n.scratch is not None:  # from the first op that uses it to the last (matmuls may share one)
            values[n.scratch.name] = n.scratch
            first.setdefault(n.scratch.name, i)
            last[n.scratch.name] = i
    assert all(v.kind in ARENA_KINDS for v in values.values())
    return [Lifetime(values[name], first[name], last[name]) for name in values]
