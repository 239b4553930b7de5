"""Build the step graph of a model: the head, one layer's body stage by stage, the tail.

An architecture's `block` lists stages; `STAGES` maps each to the function that emits its nodes.
A body is built once, from the tensors and hyperparameters of the first layer that runs it (a
hybrid model has two: attention layers run `block`, recurrent ones `recurrent_block`; nomic-bert-moe
two, its MoE layers running `moe_block`; Gemma 4 one per layer kind and KV ownership, emitter.py's
body_names); every layer that runs it must then have a tensor of the same shape for every role the body uses, and `Graph.layers` records which
(with each layer's kind, window and rope base). A role may be a range of rows of a file tensor (Phi-3's fused attn_qkv and
ffn_up) or a tensor every layer shares (the rope factors).
"""
from __future__ import annotations

from dataclasses import replace

from ..core.errors import ArchitectureError
from ..frontend.architecture import Architecture, LayerKind
from ..frontend.spec import ModelSpec
from .emitter import GraphBuilder
from .graph import Body, Graph, Node, Section, Value, ValueKind
from .stages import STAGES

# A body's nodes and activations are named after llama.cpp's, with a prefix for every body but the
# first: bodies share stage names (attn_norm, ffn_up) but never an arena value.
RECURRENT_PREFIX = "rec."


def body_prefix(name: str) -> str:
    return "" if name == Section.BODY else RECURRENT_PREFIX if name == Section.RECURRENT else f"{name}."


def _prefixed(nodes: tuple[Node, ...], prefix: str) -> tuple[Node, ...]:
    if not prefix:
        return nodes
    renamed: dict[Value, Value] = {}

    def name(v: Value) -> Value:
        if v.kind is not ValueKind.ACTIVATION:
            return v
        return renamed.setdefault(v, replace(v, name=prefix + v.name))
    return tuple(replace(n, name=prefix + n.name, inputs=tuple(map(name, n.inputs)), outputs=tuple(map(name, n.outputs)))
                 for n in nodes)


def _body(b: GraphBuilder, name: str) -> tuple[Body, dict]:
    """The body `name`, built from the first layer that runs it (its tensors, its shapes: the
    hyperparameters of that layer), and the roles it binds."""
    b.first = b.body_names.index(name)
    b.hp, b.roles, b.cur = b.spec.hparams.for_layer(b.first), {}, b.x
    for stage in b.arch.block_of(b.kinds[b.first]):
        STAGES[stage](b)
    b.hp = b.spec.hparams
    return Body(name, _prefixed(b.take(), body_prefix(name))), b.roles


def build_graph(spec: ModelSpec, arch: Architecture, n_tokens: int, n_ctx: int | None = None,
                embedding: bool = False) -> Graph:
    """The step graph for batches of up to n_tokens rows, for a context of n_ctx positions (which
    picks Phi-3's long or short rope factors; None: short); `embedding`: it returns hidden states
    in place of logits (an encoder's always does)."""
    b = GraphBuilder(spec, arch, n_tokens, n_ctx, embedding)
    if LayerKind.RECURRENT in b.kinds and all(k is LayerKind.RECURRENT for k in b.kinds):
        raise ArchitectureError(f"{spec.path}: every layer is recurrent; kiln plans hybrids with attention layers")
    head = b.head()
    names = list(dict.fromkeys(sorted(b.body_names, key=lambda n: n != Section.BODY)))  # BODY first, then by layer
    bodies, roles = [], {}
    for name in names:
        body, roles[name] = _body(b, name)
        bodies.append(body)
    tail = b.tail()
    state = (b.x,) + ((b.per_layer,) if b.per_layer is not None else ())
    return Graph(n_tokens, tuple(b.inputs.values()), state, tail[-1].outputs, head, tuple(bodies), tail,
                 b.layers(roles), b.unused + b.pooling_tensors(), b.embedding)
