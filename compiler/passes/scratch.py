"""Give every matmul a scratch buffer for its quantized activations, so the planner places it.

The scratch lives only during its op; the allocator packs all of them into the same bytes.
"""
from __future__ import annotations

from dataclasses import replace
from math import prod

from ..dtypes import DType, act_row_bytes
from ..ir import Graph, Op, Value, ValueKind

NEEDS_SCRATCH = (Op.MATMUL, Op.LOGITS)


def add_scratch(g: Graph) -> Graph:
    nodes = []
    for n in g.nodes:
        if n.op in NEEDS_SCRATCH:
            x, w = n.inputs[0], n.inputs[1]
            rows, n_in = x.shape[0], prod(x.shape[1:])
            size = rows * act_row_bytes(w.dtype, n_in)
            n = replace(n, scratch=Value(f"{n.label}.act", ValueKind.ACTIVATION, (size,), DType.I8, n.layer))
        nodes.append(n)
    return replace(g, nodes=tuple(nodes))
