"""Give the ops that need working memory a scratch buffer, so the planner places it: a matmul
its quantized activations, an attention the span states of a lone token's history, a mixture of
experts its slots (runtime_c/moe.c).

The scratch lives only during its op (a run of matmuls sharing their rows' copy: from the first
to the last); the allocator packs all of them into the same bytes. A body op's scratch is sized
for the layer that needs the most (Q4_K_M files mix weight types).
"""
from __future__ import annotations

from dataclasses import replace
from math import prod

from ..core.cconst import ATTN_SPAN, ATTN_SPAN_STATE
from ..core.dtypes import DType, act_row_bytes, matmul_scratch_bytes, same_act_format
from ..ir.graph import Graph, Node, Op, Value, ValueKind, moe_weights, scratch_from
from ..ir.kv import KVConfig

# A lone token's spans are work items for the threads, their states kept in the scratch until they
# are merged; a longer history than MAX_SPANS spans runs its spans one after another (attention.c).
MAX_SPANS = 1024


def attention_spans(kv: KVConfig) -> int:
    return min(-(-kv.ctx // ATTN_SPAN), MAX_SPANS)


def _matmul_bytes(g: Graph, n: Node, kv: KVConfig) -> int:
    """The quantized rows, then (from a multiple of 64) their scales as the x8 kernels take them."""
    x, w = n.inputs[0], n.inputs[1]
    return max(matmul_scratch_bytes(t.dtype, x.shape[0], prod(x.shape[1:])) for t in g.tensors(w))


def _attention_bytes(g: Graph, n: Node, kv: KVConfig) -> int:
    a = n.attrs
    return 4 * a.n_head * attention_spans(kv) * (a.head_dim + ATTN_SPAN_STATE)


def moe_scratch_bytes(gate: DType, up: DType, down: DType, rows: int, n_expert: int, n_used: int, n_ff: int,
                      n_embd: int) -> int:
    """kiln_moe_scratch_bytes (runtime_c/moe.c's parts, each 64-byte aligned; a kernel test holds
    the two together): the slots' list, x's activations by row and by slot (for up too where its
    format is another), gate's and up's rows side by side by slot, down's activations and output by slot."""
    slots, ag, ad = rows * n_used, act_row_bytes(gate, n_embd), act_row_bytes(down, n_ff)
    au = 0 if same_act_format(gate, up) else act_row_bytes(up, n_embd)
    parts = (4 * (n_expert + 1), 4 * slots, 4 * slots, rows * ag, slots * ag, rows * au, slots * au,
             8 * slots * n_ff, slots * ad, 4 * slots * n_embd)
    return sum(-(-p // 64) * 64 for p in parts)


def _moe_bytes(g: Graph, n: Node, kv: KVConfig) -> int:
    x, a, w = n.inputs[0], n.attrs, moe_weights(n)
    gate, up = (w["gate_up"],) * 2 if "gate_up" in w else (w.get("gate", w["up"]), w["up"])  # no gate: up's rows
    down = w["down"]
    return max(moe_scratch_bytes(tg.dtype, tu.dtype, td.dtype, x.shape[0], a.n_expert, a.n_used, down.shape[2],
                                 x.shape[1]) for tg, tu, td in zip(*(g.tensors(v) for v in (gate, up, down))))


SCRATCH_BYTES = {Op.MATMUL: _matmul_bytes, Op.LOGITS: _matmul_bytes, Op.ATTENTION: _attention_bytes,
                 Op.MOE_FFN: _moe_bytes}
SCRATCH_NAME = {Op.MATMUL: "act", Op.LOGITS: "act", Op.ATTENTION: "spans", Op.MOE_FFN: "slots"}


def add_scratch(g: Graph, kv: KVConfig) -> Graph:
    for section, nodes in g.sections():
        owner = {n.name: scratch_from(n) or n.name for n in nodes}  # whose scratch each op uses
        size: dict[str, int] = {}
        for n in nodes:  # a shared buffer holds the largest of its matmuls' rows
            need = SCRATCH_BYTES[n.op](g, n, kv) if n.op in SCRATCH_BYTES else 0
            size[owner[n.name]] = max(size.get(owner[n.name], 0), need)
        scratch = {n.name: Value(f"{n.name}.{SCRATCH_NAME[n.op]}", ValueKind.ACTIVATION, (size[n.name],), DType.I8)
                   for n in nodes if owner[n.name] == n.name and size[n.name]}
        g = g.with_nodes(section, [replace(n, scratch=scratch[owner[n.name]]) if owner[n.name] in scratch else n
                                   for n in nodes])
    return g
