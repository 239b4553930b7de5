"""Give the ops that need working memory a scratch buffer, so the planner places it: a matmul
its quantized activations, an attention the span states of a lone token's history.

The scratch lives only during its op; the allocator packs all of them into the same bytes. A
body op's scratch is sized for the layer that needs the most (Q4_K_M files mix weight types).
"""
from __future__ import annotations

from dataclasses import replace
from math import prod

from ..core.cconst import ATTN_SPAN, ATTN_SPAN_STATE
from ..core.dtypes import DType, act_row_bytes
from ..ir.graph import Graph, Node, Op, Value, ValueKind
from ..ir.kv import KVConfig

# A lone token's spans are work items for the threads, their states kept in the scratch until they
# are merged; a longer history than MAX_SPANS spans runs its spans one after another (attention.c).
MAX_SPANS = 1024


def attention_spans(kv: KVConfig) -> int:
    return min(-(-kv.ctx // ATTN_SPAN), MAX_SPANS)


def _matmul_bytes(g: Graph, n: Node, kv: KVConfig) -> int:
    x, w = n.inputs[0], n.inputs[1]
    return x.shape[0] * max(act_row_bytes(t.dtype, prod(x.shape[1:])) for t in g.tensors(w))


def _attention_bytes(g: Graph, n: Node, kv: KVConfig) -> int:
    a = n.attrs
    return 4 * a.n_head * attention_spans(kv) * (a.head_dim + ATTN_SPAN_STATE)


SCRATCH_BYTES = {Op.MATMUL: _matmul_bytes, Op.LOGITS: _matmul_bytes, Op.ATTENTION: _attention_bytes}
SCRATCH_NAME = {Op.MATMUL: "act", Op.LOGITS: "act", Op.ATTENTION: "spans"}


def add_scratch(g: Graph, kv: KVConfig) -> Graph:
    for section, nodes in g.sections():
        out = []
        for n in nodes:
            size = SCRATCH_BYTES[n.op](g, n, kv) if n.op in SCRATCH_BYTES else 0
            if size:
                n = replace(n, scratch=Value(f"{n.name}.{SCRATCH_NAME[n.op]}", ValueKind.ACTIVATION, (size,), DType.I8))
            out.append(n)
        g = g.with_nodes(section, out)
    return g
