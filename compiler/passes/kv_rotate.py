"""Hold a quantized K (V) cache in Hadamard blocks, as llama.cpp does (ir/kv.py says why).

Before: attention(q_rope, k_rope, v)
After:  K rotated: attention(q_rot, k_rot, v) with q_rot = H q_rope, k_rot = H k_rope;
        V rotated: attention(.., .., v_rot) with v_rot = H v, and its output rotated back,
        attn = H attn_rot (H is its own inverse; the output is a weighted sum of rotated V rows).
H is the orthonormal 64x64 Hadamard matrix applied to each block of 64 of every head. A layer
that keeps no KV (it reads another's) rotates its q and its output alike. Runs before kv_insert,
so that the cache stores what attention reads; in every body with attention.
"""
from __future__ import annotations

from dataclasses import replace

from ..ir.builder import body_prefix
from ..ir.graph import Graph, Node, Op, Value, ValueKind
from ..ir.kv import KVConfig


def _rotated(v: Value, name: str) -> tuple[Node, Value]:
    out = replace(v, name=name)
    return Node(Op.HADAMARD, name, (v,), (out,)), out


def _rotate_body(nodes: tuple[Node, ...], kv: KVConfig, prefix: str) -> list[Node]:
    out: list[Node] = []
    for n in nodes:
        if n.op is not Op.ATTENTION:
            out.append(n)
            continue
        q, *rest = n.inputs
        owns = bool(rest) and rest[0].kind is ValueKind.ACTIVATION  # its own k and v, else its source's
        k, v, extra = (rest[0], rest[1], rest[2:]) if owns else (None, None, rest)
        if kv.k_hadamard:
            rq, q = _rotated(q, prefix + "q_rot")
            out.append(rq)
            if owns:
                rk, k = _rotated(k, prefix + "k_rot")
                out.append(rk)
        if kv.v_hadamard and owns:
            rv, v = _rotated(v, prefix + "v_rot")
            out.append(rv)
        inputs = (q, *((k, v) if owns else ()), *extra)
        if kv.v_hadamard:
            (o,) = n.outputs
            inner = replace(o, name=prefix + "attn_rot")
            out.append(replace(n, name=prefix + "attn_rot", inputs=inputs, outputs=(inner,)))
            out.append(Node(Op.HADAMARD, n.name, (inner,), (o,)))
        else:
            out.append(replace(n, inputs=inputs))
    return out


def rotate_kv(g: Graph, kv: KVConfig) -> Graph:
    if not (kv.k_hadamard or kv.v_hadamard):
        return g
    for body in g.bodies:
        g = g.with_nodes(body.name, _rotate_body(body.nodes, kv, body_prefix(body.name)))
    return g
