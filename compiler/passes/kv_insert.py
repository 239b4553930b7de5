"""Insert the KV-cache writes and point attention at the cache.

Before: attention(q, k, v) reads this step's K/V only, as in a plain transformer.
After:  kv_cache_store writes k and v into the layer's pages right after the later of the two is
        computed (after rope), each row at (inp_seq, inp_row); attention(q, inp_seq, inp_row, seen,
        kv_cache.k, kv_cache.v) reads what each row at inp_row sees of its own sequence from the
        cache: up to itself (seen is inp_row), or in a bidirectional model up to its sequence's
        last row in the step (inp_seen), so that every row of an input sees all of it. K and V are two values because each has its own element type. A layer that keeps
        no KV (attention(q) alone) reads the pages of the layer it shares them with and writes none.
The cache's values have the shape of each body's heads: layer kinds may differ in head width and
KV heads (Gemma 4).
"""
from __future__ import annotations

from dataclasses import replace

from ..ir.builder import body_prefix
from ..ir.graph import Graph, Node, Op, Value, ValueKind
from ..ir.kv import KVConfig


def kv_values(kv: KVConfig, n_head_kv: int, head_dim: int) -> tuple[Value, Value]:
    """A layer's K and V in one page, [kv_head][row][head_dim] each."""
    shape = (n_head_kv, kv.page_size, head_dim)
    return (Value("kv_cache.k", ValueKind.KV, shape, kv.k_dtype), Value("kv_cache.v", ValueKind.KV, shape, kv.v_dtype))


def _insert(nodes: tuple[Node, ...], seq: Value, row: Value, seen: Value, kv: KVConfig,
            prefix: str) -> tuple[Node, ...]:
    attn = next((n for n in nodes if n.op is Op.ATTENTION), None)
    if attn is None:  # a recurrent body
        return nodes
    cache = kv_values(kv, attn.attrs.n_head_kv, attn.attrs.head_dim)
    q, *rest = attn.inputs
    owns = bool(rest) and rest[0].kind is ValueKind.ACTIVATION
    k, v, extra = (rest[0], rest[1], rest[2:]) if owns else (None, None, rest)
    last = max(i for i, n in enumerate(nodes) if set(n.outputs) & {k, v}) if owns else -1  # the later of k, v
    out: list[Node] = []
    for i, n in enumerate(nodes):
        if n is attn:
            n = replace(n, inputs=(q, seq, row, seen, *cache, *extra))  # then its sinks, if any
        out.append(n)
        if i == last:
            out.append(Node(Op.KV_STORE, prefix + "kv_store", (k, v, seq, row, *cache), ()))
    return tuple(out)


def insert_kv_ops(g: Graph, kv: KVConfig) -> Graph:
    seq, row = g.input("inp_seq"), g.input("inp_row")
    # a bidirectional model's rows each see up to their sequence's last row of the step (inp_seen)
    seen = next((v for v in g.inputs if v.name == "inp_seen"), row)
    for body in g.bodies:
        g = g.with_nodes(body.name, _insert(body.nodes, seq, row, seen, kv, body_prefix(body.name)))
    return g
