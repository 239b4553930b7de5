"""The op-level IR: typed values, nodes with one of a fixed set of ops, and the step graph.

A step runs a batch of rows (decode tokens beside prefill chunks): the graph's `head` (the
embedding), then for every layer the body it runs, then the `tail` (final norm, logits). Most
models have one body; a hybrid's recurrent layers run a `recurrent` one, and a model whose layer
kinds differ in shape (Gemma 4's sliding and global layers, its layers that read another's KV)
one per kind. A body is written once, for every layer that runs it: its weights are named by their
role in a layer (`attn_q`), and `layers` says which body each layer runs and which tensor each role
is in it, with what else differs between layers (kind, window, rope base). The residual stream is
the graph's `state`: one buffer the head writes, each layer adds into, and the tail reads.

An op's parameters beyond its operands are records of attrs.py (OP_ATTRS here says which op takes
which). Values and nodes are immutable; passes return new graphs, so each pass can be tested by
comparing the graph before and after it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from math import prod
from typing import Mapping

from ..core.dtypes import DType
from ..frontend.architecture import LayerKind
from ..frontend.spec import TensorInfo
from .attrs import (  # noqa: F401 (the op records, importable with the graph as ever)
    MOE_PARTS, AttentionAttrs, Attrs, ConvAttrs, DeltaNetAttrs, EmbedAttrs, GluAttrs, MatmulAttrs, MoeAttrs,
    NormAttrs, RegroupAttrs, RopeAttrs, RopeRotation, RopeTableAttrs, RouteAttrs, ScaleAttrs, SoftcapAttrs)


class Op(Enum):
    EMBED = "embed"  # gather weight rows by token id, times a scale
    RMS_NORM = "rms_norm"  # x / rms(x) * (w + offset), over the last axis
    MATMUL = "matmul"  # y = x W^T (+ bias); W is [n_out, n_in]
    ROPE = "rope"  # rotate each head by its position (the layer's rope base)
    ROPE_TABLE = "rope_table"  # each row's rope rotations (cos, sin), once a step for every layer's ropes
    HADAMARD = "hadamard"  # each block of 64 times the orthonormal Hadamard matrix (its own inverse)
    ATTENTION = "attention"  # softmax(q k^T * scale + mask) v, GQA, over the layer's cache
    KV_STORE = "kv_cache_store"  # write the step's K and V rows into the layer's cache
    ADD = "add"  # y = a + b; into the residual stream, in place
    GLU = "glu"  # act(gate) * up
    SELECT_ROWS = "select_rows"  # the rows whose logits the caller asked for, in order
    LOGITS = "logits"  # LM head over the rows the caller asks for, into caller memory
    SCALE = "scale"  # y = x * s (granite's residual branches and logits; s a weight's one value: Gemma 4's)
    SOFTCAP = "softcap"  # y = c * tanh(x / c) (Gemma 2's logits)
    MOE_ROUTE = "moe_route"  # router logits -> each row's top-k experts (argsort of the softmax) and weights
    MOE_FFN = "moe_ffn"  # each row's chosen experts' GLU FFNs, times their weights, summed in rank order
    REGROUP = "regroup"  # [rows, groups, parts] -> outputs, each its parts of every group (Q and its gate)
    SSM_CONV = "ssm_conv"  # SiLU of a causal conv1d over each channel's last taps, the window kept per sequence
    DELTA_NET = "delta_net"  # the gated delta rule over each sequence's state matrices, token by token
    LAYER_SLICE = "layer_slice"  # the running layer's part of a [rows, n_layer, width] state (Gemma 4's)
    LAYER_NORM = "layer_norm"  # (x - mean(x)) / sqrt(var(x) + eps) * w + b, over the last axis (BERT's)
    ACTIVATE = "activate"  # y = act(x), a plain FFN's activation (GluAttrs names it)


class ValueKind(Enum):
    INPUT = "input"  # the step's batch arrays (token ids, positions, sequences, rows wanted): caller memory
    WEIGHT = "weight"  # a read-only view of the GGUF file (or its packed copy)
    ACTIVATION = "activation"  # lives in the planned activation arena during its live range
    STATE = "state"  # in the arena for the whole step: the residual stream, updated in place by each layer
    # (and Gemma 4's per-layer embeddings, which the head writes and each layer reads its part of)
    KV = "kv"  # the layer's pages of the persistent cache
    RECURRENT = "recurrent"  # the layer's part of each sequence's recurrent state slot (planner/state_plan.py)
    OUTPUT = "output"  # written straight into the caller's buffer (logits); never in the arena


ARENA_KINDS = (ValueKind.ACTIVATION, ValueKind.STATE)


@dataclass(frozen=True)
class Value:
    name: str
    kind: ValueKind
    shape: tuple[int, ...]  # [rows, ...] for activations; a layer weight's shape is the same in every layer
    dtype: DType | None  # None for a layer weight: its type is its tensor's in each layer (Graph.layers)
    tensor: TensorInfo | None = None  # a head or tail weight: the file range it views

    @property
    def n_elems(self) -> int:
        return prod(self.shape)

    @property
    def nbytes(self) -> int:
        if self.tensor is not None:
            return self.tensor.nbytes
        return self.dtype.nbytes(self.n_elems)


# The attrs type each op must carry (checked by the validate pass).
OP_ATTRS: dict[Op, type | None] = {
    Op.EMBED: EmbedAttrs,
    Op.RMS_NORM: NormAttrs,
    Op.MATMUL: MatmulAttrs,
    Op.ROPE: RopeAttrs,
    Op.ROPE_TABLE: RopeTableAttrs,
    Op.HADAMARD: None,
    Op.ATTENTION: AttentionAttrs,
    Op.KV_STORE: None,
    Op.ADD: None,
    Op.GLU: GluAttrs,
    Op.SELECT_ROWS: None,
    Op.LOGITS: None,
    Op.SCALE: ScaleAttrs,
    Op.SOFTCAP: SoftcapAttrs,
    Op.MOE_ROUTE: RouteAttrs,
    Op.MOE_FFN: MoeAttrs,
    Op.REGROUP: RegroupAttrs,
    Op.SSM_CONV: ConvAttrs,
    Op.DELTA_NET: DeltaNetAttrs,
    Op.LAYER_SLICE: None,
    Op.LAYER_NORM: NormAttrs,
    Op.ACTIVATE: GluAttrs,
}


@dataclass(frozen=True)
class Node:
    op: Op
    name: str  # llama.cpp's names (attn_norm, ffn_inp, ...): grep the generated C and the maps for them
    inputs: tuple[Value, ...]
    outputs: tuple[Value, ...]
    attrs: Attrs = None
    kernel: str | None = None  # the runtime function, set by the kernel-selection pass
    scratch: Value | None = None  # working memory the kernel needs during this op only


def moe_weights(n: "Node") -> dict[str, "Value"]:
    """A moe_ffn node's weights by part (MoeAttrs.parts)."""
    return dict(zip(n.attrs.parts, n.inputs[3:]))


def scratch_from(n: Node) -> str | None:
    """The node whose scratch n uses as well (a matmul reading another's quantized rows), or None."""
    return n.attrs.act_from if n.op is Op.MATMUL else None


@dataclass(frozen=True)
class Layer:
    """What one layer's run of its body uses: its tensors by role, and how it differs from others."""
    index: int
    kind: LayerKind
    window: int | None  # local layers: a query at p sees keys in (p - window, p]
    rope_base: float
    weights: Mapping[str, TensorInfo] = field(hash=False)  # role -> tensor ("attn_q" -> blk.3.attn_q.weight)
    body: str = "body"  # the body it runs (Graph.bodies)
    kv_source: int | None = None  # a layer that keeps no KV of its own attends to this one's (Gemma 4)


class Section:
    """The graph's parts, by name: the head, each body, the tail. BODY is the attention layers' body
    (the first one, where layer kinds differ in shape), RECURRENT a hybrid's recurrent layers'."""
    HEAD, BODY, RECURRENT, TAIL = "head", "body", "recurrent", "tail"


@dataclass(frozen=True)
class Body:
    name: str  # Section.BODY, Section.RECURRENT, or the kind of the layers that run it
    nodes: tuple[Node, ...]


@dataclass(frozen=True)
class Graph:
    n_tokens: int  # rows a step is planned for (the batch)
    inputs: tuple[Value, ...]
    state: tuple[Value, ...]
    outputs: tuple[Value, ...]
    head: tuple[Node, ...]
    bodies: tuple[Body, ...]
    tail: tuple[Node, ...]
    layers: tuple[Layer, ...]
    unused: tuple[str, ...] = ()  # file tensors the architecture knows but this configuration does not read
    embedding: bool = False  # the output is each wanted row's hidden state [rows, n_embd], not logits

    @property
    def body(self) -> tuple[Node, ...]:
        """The attention layers' body (the first, where there are several)."""
        return self.bodies[0].nodes

    @property
    def recurrent(self) -> tuple[Node, ...]:
        """The recurrent layers' body (a hybrid model), else empty."""
        return next((b.nodes for b in self.bodies if b.name == Section.RECURRENT), ())

    @property
    def nodes(self) -> tuple[Node, ...]:
        """The schedule with each body once: op indices in the plan and the maps count in it."""
        return self.head + self.body_nodes + self.tail

    def sections(self) -> list[tuple[str, tuple[Node, ...]]]:
        return [(Section.HEAD, self.head), *((b.name, b.nodes) for b in self.bodies), (Section.TAIL, self.tail)]

    def section_of(self, index: int) -> str:
        for section, nodes in self.sections():
            if index < len(nodes):
                return section
            index -= len(nodes)
        return Section.TAIL

    def is_body(self, section: str) -> bool:
        return section not in (Section.HEAD, Section.TAIL)

    def layers_of(self, section: str) -> tuple[Layer, ...]:
        """The layers that run a body, or every layer for head and tail."""
        if self.is_body(section):
            return tuple(ly for ly in self.layers if ly.body == section)
        return self.layers

    @property
    def body_nodes(self) -> tuple[Node, ...]:
        """The nodes of every layer body."""
        return tuple(n for b in self.bodies for n in b.nodes)

    def input(self, name: str) -> Value:
        return next(v for v in self.inputs if v.name == name)

    def with_nodes(self, section: str, nodes) -> "Graph":
        from dataclasses import replace

        if not self.is_body(section):
            return replace(self, **{section: tuple(nodes)})
        return replace(self, bodies=tuple(Body(b.name, tuple(nodes)) if b.name == section else b for b in self.bodies))

    def weights(self) -> list[Value]:
        return [v for n in self.nodes for v in n.inputs if v.kind is ValueKind.WEIGHT]

    def layer_tensors(self, role: str) -> list[TensorInfo]:
        """The tensor a body weight role names, in each layer that has the role."""
        return [ly.weights[role] for ly in self.layers if role in ly.weights]

    def tensors(self, v: Value) -> list[TensorInfo]:
        """Every tensor a weight value stands for: its own, or one per layer."""
        return [v.tensor] if v.tensor is not None else self.layer_tensors(v.name)

    def activations(self) -> list[Value]:
        return [v for n in self.nodes for v in n.outputs if v.kind is ValueKind.ACTIVATION]
