"""Build the step graph of a model: the head, one layer's body stage by stage, the tail.

An architecture's `block` lists stages; `STAGES` maps each to the function that emits its nodes.
A body is built once, from the tensors of the first layer of its kind (a hybrid model has two:
attention layers run `block`, recurrent ones `recurrent_block`); every layer of that kind must then
have a tensor of the same shape for every role the body uses, and `Graph.layers` records which
(with each layer's kind, window and rope base). A role may be a range of rows of a file tensor (Phi-3's fused attn_qkv and
ffn_up) or a tensor every layer shares (the rope factors).
"""
from __future__ import annotations

from dataclasses import replace

from ..core.errors import ArchitectureError
from ..frontend.architecture import Architecture, LayerKind
from ..frontend.spec import ModelSpec
from .emitter import GraphBuilder
from .graph import Graph, Node, Value, ValueKind
from .stages import STAGES

# The recurrent body's nodes and activations are named like the attention body's, with this prefix:
# the two share stage names (attn_norm, ffn_up) but never an arena value.
RECURRENT_PREFIX = "rec."


def _prefixed(nodes: tuple[Node, ...], prefix: str) -> tuple[Node, ...]:
    renamed: dict[Value, Value] = {}

    def name(v: Value) -> Value:
        if v.kind is not ValueKind.ACTIVATION:
            return v
        return renamed.setdefault(v, replace(v, name=prefix + v.name))
    return tuple(replace(n, name=prefix + n.name, inputs=tuple(map(name, n.inputs)), outputs=tuple(map(name, n.outputs)))
                 for n in nodes)


def _body(b: GraphBuilder, recurrent: bool = False) -> tuple[tuple[Node, ...], dict]:
    """One kind's body, built from the first layer of that kind, and the roles it binds."""
    kind = LayerKind.RECURRENT
    b.first = next(il for il, k in enumerate(b.kinds) if (k is kind) == recurrent)
    b.roles, b.cur = {}, b.x
    for stage in b.arch.recurrent_block if recurrent else b.arch.block:
        STAGES[stage](b)
    nodes = b.take()
    return (_prefixed(nodes, RECURRENT_PREFIX) if recurrent else nodes), b.roles


def build_graph(spec: ModelSpec, arch: Architecture, n_tokens: int, n_ctx: int | None = None) -> Graph:
    """The step graph for batches of up to n_tokens rows, for a context of n_ctx positions (which
    picks Phi-3's long or short rope factors; None: short)."""
    b = GraphBuilder(spec, arch, n_tokens, n_ctx)
    if LayerKind.RECURRENT in b.kinds and all(k is LayerKind.RECURRENT for k in b.kinds):
        raise ArchitectureError(f"{spec.path}: every layer is recurrent; kiln plans hybrids with attention layers")
    head = b.head()
    body, roles = _body(b)
    recurrent, recurrent_roles = _body(b, recurrent=True) if LayerKind.RECURRENT in b.kinds else ((), {})
    tail = b.tail()
    return Graph(n_tokens, tuple(b.inputs.values()), (b.x,), tail[-1].outputs, head, body, tail,
                 b.layers(roles, recurrent_roles), b.unused, recurrent)
