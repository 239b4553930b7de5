"""A step's ropes take their rotations from one table, which the head computes once.

A rope turns each pair of a head's dims by an angle of the row's position (ir/rope.py has its
parameters), through the cos and sin of that angle: libm's cosf and sinf, n_rot / 2 of each a row,
in q's rope and in k's of every layer. They depend on the position, on the layer's base, its
rotated dims and whether the frequency factors divide the angles, and on nothing else of the
layer: SmolLM2's 30 layers made each row's 32 cos and 32 sin sixty times, most of its ropes' time.
So this pass adds to the head one ROPE_TABLE node, which writes each distinct rotation of the
layers into the state value `rope_table` (a row's rotations side by side), and each rope reads
its layer's part (LAYERS[l].rope_table, RopeTableAttrs.layers). The same cosf and sinf of the
same angles, so the same bits as each rope making its own.
"""
from __future__ import annotations

from dataclasses import replace

from ..core.dtypes import DType
from ..core.errors import GraphError
from ..ir.graph import Graph, Layer, Node, Op, RopeRotation, RopeTableAttrs, Value, ValueKind

TABLE = "rope_table"


def _rope(nodes: tuple[Node, ...]) -> Node | None:
    return next((n for n in nodes if n.op is Op.ROPE), None)


def _rotation(ly: Layer, rope: Node | None) -> tuple[float, int, bool] | None:
    """A layer's rotation: its base, rotated dims, frequency factors or not; None where it rotates
    nothing (no rope in its body, or base 0: a layer without positions, NoPE)."""
    if rope is None or not ly.rope_base:
        return None
    return ly.rope_base, rope.attrs.n_rot, len(rope.inputs) > 2


def _factors(g: Graph, ropes: dict[str, Node | None]) -> Value | None:
    """The frequency factors, as a weight of the head: the one file tensor every rope that reads them
    reads (ir/stages.py binds it to a role of each)."""
    tensors = {(t.name, t.offset): t for body, n in ropes.items() if n is not None and len(n.inputs) > 2
               for t in g.layer_tensors(n.inputs[2].name)}
    if not tensors:
        return None
    if len(tensors) > 1:
        raise GraphError(f"the ropes read {len(tensors)} frequency-factor tensors ({', '.join(sorted(n for n, _ in tensors))}); "
                         "kiln's rope table takes one")
    t = next(iter(tensors.values()))
    return Value(t.name, ValueKind.WEIGHT, t.shape, t.dtype, t)


def rope_table(g: Graph) -> Graph:
    ropes = {b.name: _rope(b.nodes) for b in g.bodies}
    if not any(ropes.values()):
        return g
    per_layer = [_rotation(ly, ropes[ly.body]) for ly in g.layers]
    distinct = list(dict.fromkeys(r for r in per_layer if r is not None))
    at = [sum(n_rot for _, n_rot, _ in distinct[:k]) for k in range(len(distinct))]
    rotations = tuple(RopeRotation(base, n_rot, factors, a) for (base, n_rot, factors), a in zip(distinct, at))
    row = sum(r.n_rot for r in rotations)
    table = Value(TABLE, ValueKind.STATE, (g.n_tokens, max(row, 1)), DType.F32)
    factors = _factors(g, ropes)
    first = next(n for n in ropes.values() if n is not None)
    if any(replace(n.attrs, n_rot=first.attrs.n_rot) != first.attrs for n in ropes.values() if n is not None):
        raise GraphError("the bodies' ropes differ in scaling or layout; kiln's rope table takes one of each")
    attrs = RopeTableAttrs(rotations, row, first.attrs,
                           tuple(-1 if r is None else distinct.index(r) for r in per_layer))
    node = Node(Op.ROPE_TABLE, TABLE, (g.input("inp_pos"),) + ((factors,) if factors else ()), (table,), attrs)
    read = {n.inputs[2].name for b in g.bodies for n in b.nodes if n.op is Op.ROPE and len(n.inputs) > 2}  # factors' roles
    layers = tuple(replace(ly, weights={r: t for r, t in ly.weights.items() if r not in read}) for ly in g.layers)
    g = replace(g, head=g.head + (node,), state=g.state + (table,), layers=layers)
    for body in g.bodies:
        g = g.with_nodes(body.name, [replace(n, inputs=(n.inputs[0], table)) if n.op is Op.ROPE else n
                                     for n in body.nodes])
    return g


def table_node(g: Graph) -> Node | None:
    """The head's rope table, where the model has ropes."""
    return next((n for n in g.head if n.op is Op.ROPE_TABLE), None)
