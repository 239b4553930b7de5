"""Insert the KV-cache writes and point attention at the cache.

Before: attention(q, k, v) reads this step's K/V only, as in a plain transformer.
After:  kv_cache_store (decode) or kv_cache_batch_copy (prefill) writes k and v into the
        layer's pages right after the later of the two is computed (after rope), each row at
        (inp_seq, inp_row); attention(q, inp_seq, inp_row, kv_cache.k, kv_cache.v) reads each
        row's visible history of its own sequence from the cache. K and V are two values
        because each has its own element type.
"""
from __future__ import annotations

from dataclasses import replace

from ..ir.graph import Graph, Mode, Node, Op, Value, ValueKind
from ..planner.kv_plan import KVPlan

WRITE_OP = {Mode.DECODE: Op.KV_STORE, Mode.PREFILL: Op.KV_BATCH_COPY}


def kv_values(plan: KVPlan, layer: int) -> tuple[Value, Value]:
    """The layer's K and V in one page, [kv_head][row][head_dim] each."""
    shape = (plan.n_head_kv, plan.page_size, plan.head_dim)
    return (Value(f"kv_cache-{layer}.k", ValueKind.KV, shape, plan.k_dtype, layer),
            Value(f"kv_cache-{layer}.v", ValueKind.KV, shape, plan.v_dtype, layer))


def insert_kv_ops(g: Graph, plan: KVPlan) -> Graph:
    seq, row = g.input("inp_seq"), g.input("inp_row")
    attentions = [n for n in g.nodes if n.op is Op.ATTENTION]
    # The write goes right after whichever of k and v is defined later.
    write_after: dict[str, Node] = {}
    for a in attentions:
        _, k, v = a.inputs
        last = max((i for i, n in enumerate(g.nodes) if set(n.outputs) & {k, v}))
        write_after[g.nodes[last].outputs[0].name] = a

    nodes: list[Node] = []
    for n in g.nodes:
        if n.op is Op.ATTENTION:
            q, _, _ = n.inputs
            n = replace(n, inputs=(q, seq, row, *kv_values(plan, n.layer)))
        nodes.append(n)
        attn = write_after.get(n.outputs[0].name) if n.outputs else None
        if attn is not None:
            _, k, v = attn.inputs
            op = WRITE_OP[g.mode]
            nodes.append(Node(op, "kv_store" if op is Op.KV_STORE else "kv_copy", attn.layer,
                              (k, v, seq, row, *kv_values(plan, attn.layer)), ()))
    return replace(g, nodes=tuple(nodes))
