"""Give the ops that need working memory a scratch buffer, so the planner places it: a matmul
its quantized activations, a decode attention the partial softmax of its position ranges.

The scratch lives only during its op; the allocator packs all of them into the same bytes.
"""
from __future__ import annotations

from dataclasses import replace
from math import prod

from ..dtypes import DType, act_row_bytes
from ..ir import Graph, Mode, Node, Op, Value, ValueKind

# A decode token's attention splits the positions it sees into this many ranges, each a work
# item for the threads, merged at the end (runtime_c/attention.c). Fixed, so that logits do
# not depend on the thread count.
ATTENTION_SPLITS = 4


def _matmul_bytes(n: Node, mode: Mode) -> int:
    x, w = n.inputs[0], n.inputs[1]
    return x.shape[0] * act_row_bytes(w.dtype, prod(x.shape[1:]))


def _attention_bytes(n: Node, mode: Mode) -> int:
    a = n.attrs
    return 4 * a.n_head * ATTENTION_SPLITS * (a.head_dim + 2) if mode is Mode.DECODE else 0


SCRATCH_BYTES = {Op.MATMUL: _matmul_bytes, Op.LOGITS: _matmul_bytes, Op.ATTENTION: _attention_bytes}
SCRATCH_NAME = {Op.MATMUL: "act", Op.LOGITS: "act", Op.ATTENTION: "parts"}


def add_scratch(g: Graph) -> Graph:
    nodes = []
    for n in g.nodes:
        size = SCRATCH_BYTES[n.op](n, g.mode) if n.op in SCRATCH_BYTES else 0
        if size:
            name = f"{n.label}.{SCRATCH_NAME[n.op]}"
            n = replace(n, scratch=Value(name, ValueKind.ACTIVATION, (size,), DType.I8, n.layer))
        nodes.append(n)
    return replace(g, nodes=tuple(nodes))
