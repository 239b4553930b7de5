"""Give the ops that need working memory a scratch buffer, so the planner places it: a matmul
its quantized activations, an attention the span states of a lone token's history.

The scratch lives only during its op; the allocator packs all of them into the same bytes.
"""
from __future__ import annotations

from dataclasses import replace
from math import prod

from ..core.dtypes import DType, act_row_bytes
from ..ir.graph import Graph, Node, Op, Value, ValueKind
from ..planner.kv_plan import KVPlan, ceil_div

# Attention cuts every history at multiples of this many positions (runtime_c/attention.c,
# KILN_ATTN_SPAN). A lone token's spans are work items for the threads, their states kept here
# until they are merged; a longer history than MAX_SPANS spans runs its spans one after another.
ATTENTION_SPAN = 64
MAX_SPANS = 1024


def attention_spans(kv: KVPlan) -> int:
    return min(ceil_div(kv.ctx, ATTENTION_SPAN), MAX_SPANS)


def _matmul_bytes(n: Node, kv: KVPlan) -> int:
    x, w = n.inputs[0], n.inputs[1]
    return x.shape[0] * act_row_bytes(w.dtype, prod(x.shape[1:]))


def _attention_bytes(n: Node, kv: KVPlan) -> int:
    a = n.attrs
    return 4 * a.n_head * attention_spans(kv) * (a.head_dim + 2)


SCRATCH_BYTES = {Op.MATMUL: _matmul_bytes, Op.LOGITS: _matmul_bytes, Op.ATTENTION: _attention_bytes}
SCRATCH_NAME = {Op.MATMUL: "act", Op.LOGITS: "act", Op.ATTENTION: "spans"}


def add_scratch(g: Graph, kv: KVPlan) -> Graph:
    nodes = []
    for n in g.nodes:
        size = SCRATCH_BYTES[n.op](n, kv) if n.op in SCRATCH_BYTES else 0
        if size:
            name = f"{n.label}.{SCRATCH_NAME[n.op]}"
            n = replace(n, scratch=Value(name, ValueKind.ACTIVATION, (size,), DType.I8, n.layer))
        nodes.append(n)
    return replace(g, nodes=tuple(nodes))
