"""Matmuls that read the same rows share one quantized copy of them, and are shared among the
threads as one matrix.

A matmul quantizes its activation rows into its weight type's format before it multiplies
(runtime_c/matmul.c); q, k and v read the same normed rows, and so do a gated FFN's gate and
up. In a run of consecutive matmuls on one input whose weights take one activation format in
every layer, the first quantizes and the others read its copy (MatmulAttrs.act_from): the rows
are quantized and waited for once instead of each time. The scratch pass then gives the run
one scratch buffer, which lives from its first matmul to its last.

A run has no barriers inside it, and its weights lie one after another in the packed region (in
the order a step reads them), so each matmul also learns its place among the run's output rows
(run_at, run_rows): where a decode step would give every thread a slice of each matrix, three
short streams for q, k and v, the runtime gives each thread one slice of the run, one stream.
"""
from __future__ import annotations

from dataclasses import replace

from ..core.dtypes import same_act_format
from ..ir.graph import Graph, MatmulAttrs, Node, Op


def _same_format(g: Graph, a: Node, b: Node) -> bool:
    """Whether a's and b's weights take one activation format in every layer (Q4_K_M files mix types)."""
    return all(same_act_format(ta.dtype, tb.dtype) for ta, tb in zip(g.tensors(a.inputs[1]), g.tensors(b.inputs[1])))


def _runs(g: Graph, nodes: tuple[Node, ...]) -> list[list[Node]]:
    """The section's nodes cut into runs: consecutive matmuls on one input and activation format,
    every other node a run of its own."""
    runs: list[list[Node]] = []
    for n in nodes:
        leader = runs[-1][0] if runs else None
        if (n.op is Op.MATMUL and leader is not None and leader.op is Op.MATMUL and n.inputs[0] == leader.inputs[0]
                and _same_format(g, leader, n)):
            runs[-1].append(n)
        else:
            runs.append([n])
    return runs


def _in_run(run: list[Node]) -> list[Node]:
    if len(run) == 1:
        return run
    total = sum(n.inputs[1].shape[0] for n in run)
    at = [sum(n.inputs[1].shape[0] for n in run[:k]) for k in range(len(run))]
    return [replace(n, attrs=MatmulAttrs(act_from=run[0].name if k else None, run_at=at[k], run_rows=total))
            for k, n in enumerate(run)]


def share_act(g: Graph) -> Graph:
    for section, nodes in g.sections():
        g = g.with_nodes(section, [n for run in _runs(g, nodes) for n in _in_run(run)])
    return g
