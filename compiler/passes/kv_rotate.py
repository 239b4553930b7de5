"""Hold a quantized K (V) cache in Hadamard blocks, as llama.cpp does (ir/kv.py says why).

Before: attention(q_rope, k_rope, v)
After:  K rotated: attention(q_rot, k_rot, v) with q_rot = H q_rope, k_rot = H k_rope;
        V rotated: attention(.., .., v_rot) with v_rot = H v, and its output rotated back,
        attn = H attn_rot (H is its own inverse; the output is a weighted sum of rotated V rows).
H is the orthonormal 64x64 Hadamard matrix applied to each block of 64 of every head. Runs
before kv_insert, so that the cache stores what attention reads.
"""
from __future__ import annotations

from dataclasses import replace

from ..ir.graph import Graph, Node, Op, Section, Value
from ..ir.kv import KVConfig


def _rotated(v: Value, name: str) -> tuple[Node, Value]:
    out = replace(v, name=name)
    return Node(Op.HADAMARD, name, (v,), (out,)), out


def rotate_kv(g: Graph, kv: KVConfig) -> Graph:
    if not (kv.k_hadamard or kv.v_hadamard):
        return g
    nodes: list[Node] = []
    for n in g.body:
        if n.op is not Op.ATTENTION:
            nodes.append(n)
            continue
        q, k, v, *sinks = n.inputs
        if kv.k_hadamard:
            (rq, q), (rk, k) = _rotated(q, "q_rot"), _rotated(k, "k_rot")
            nodes += [rq, rk]
        if kv.v_hadamard:
            rv, v = _rotated(v, "v_rot")
            nodes.append(rv)
            (out,) = n.outputs
            inner = replace(out, name="attn_rot")
            nodes.append(replace(n, name="attn_rot", inputs=(q, k, v, *sinks), outputs=(inner,)))
            nodes.append(Node(Op.HADAMARD, "attn", (inner,), (out,)))
        else:
            nodes.append(replace(n, inputs=(q, k, v, *sinks)))
    return g.with_nodes(Section.BODY, nodes)
