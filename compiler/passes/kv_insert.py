"""Insert the KV-cache writes and point attention at the cache.

Before: attention(q, k, v) reads this step's K/V only, as in a plain transformer.
After:  kv_cache_store writes k and v into the layer's pages right after the later of the two is
        computed (after rope), each row at (inp_seq, inp_row); attention(q, inp_seq, inp_row,
        kv_cache.k, kv_cache.v) reads each row's visible history of its own sequence from the
        cache. K and V are two values because each has its own element type.
"""
from __future__ import annotations

from dataclasses import replace

from ..ir.graph import Graph, Node, Op, Section, Value, ValueKind
from ..ir.kv import KVConfig


def kv_values(kv: KVConfig) -> tuple[Value, Value]:
    """The layer's K and V in one page, [kv_head][row][head_dim] each."""
    shape = (kv.n_head_kv, kv.page_size, kv.head_dim)
    return (Value("kv_cache.k", ValueKind.KV, shape, kv.k_dtype), Value("kv_cache.v", ValueKind.KV, shape, kv.v_dtype))


def insert_kv_ops(g: Graph, kv: KVConfig) -> Graph:
    seq, row = g.input("inp_seq"), g.input("inp_row")
    cache = kv_values(kv)
    attn = next(n for n in g.body if n.op is Op.ATTENTION)
    k, v = attn.inputs[1:3]
    last = max(i for i, n in enumerate(g.body) if set(n.outputs) & {k, v})  # the write follows the later of k, v
    nodes: list[Node] = []
    for i, n in enumerate(g.body):
        if n.op is Op.ATTENTION:
            n = replace(n, inputs=(n.inputs[0], seq, row, *cache, *n.inputs[3:]))  # then its sinks, if any
        nodes.append(n)
        if i == last:
            nodes.append(Node(Op.KV_STORE, "kv_store", (k, v, seq, row, *cache), ()))
    return g.with_nodes(Section.BODY, nodes)
