"""Matmuls that read the same rows share one quantized copy of them.

A matmul quantizes its activation rows into its weight type's format before it multiplies
(runtime_c/matmul.c); q, k and v read the same normed rows, and so do a gated FFN's gate and
up. In a run of consecutive matmuls on one input whose weights take one activation format in
every layer, the first quantizes and the others read its copy (MatmulAttrs.act_from): the rows
are quantized and waited for once instead of each time. The scratch pass then gives the run
one scratch buffer, which lives from its first matmul to its last.
"""
from __future__ import annotations

from dataclasses import replace

from ..core.dtypes import same_act_format
from ..ir.graph import Graph, MatmulAttrs, Node, Op


def _same_format(g: Graph, a: Node, b: Node) -> bool:
    """Whether a's and b's weights take one activation format in every layer (Q4_K_M files mix types)."""
    return all(same_act_format(ta.dtype, tb.dtype) for ta, tb in zip(g.tensors(a.inputs[1]), g.tensors(b.inputs[1])))


def share_act(g: Graph) -> Graph:
    for section, nodes in g.sections():
        out: list[Node] = []
        leader: Node | None = None  # the first matmul of the current run
        for n in nodes:
            if n.op is not Op.MATMUL:
                leader = None
            elif leader is not None and n.inputs[0] == leader.inputs[0] and _same_format(g, leader, n):
                n = replace(n, attrs=MatmulAttrs(act_from=leader.name))
            else:
                leader = n
            out.append(n)
        g = g.with_nodes(section, out)
    return g
