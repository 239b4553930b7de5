"""The op-level IR: typed values, nodes with one of a fixed set of ops, and a graph per mode.

Values and nodes are immutable; passes return new graphs, so each pass can be tested by
comparing the graph before and after it. Every node carries a short name and its layer,
printed llama.cpp-style as `name-layer` (e.g. `attn_norm-3`).
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from math import prod

from ..core.dtypes import DType
from ..frontend.spec import TensorInfo
from ..frontend.architecture import Activation, LayerKind, RopeLayout


class Op(Enum):
    EMBED = "embed"  # gather weight rows by token id, times a scale
    RMS_NORM = "rms_norm"  # x / rms(x) * (w + offset), over the last axis
    MATMUL = "matmul"  # y = x W^T (+ bias); W is [n_out, n_in]
    ROPE = "rope"  # rotate each head by its position
    HADAMARD = "hadamard"  # each block of 64 times the orthonormal Hadamard matrix (its own inverse)
    ATTENTION = "attention"  # softmax(q k^T * scale + mask) v, GQA
    KV_STORE = "kv_cache_store"  # decode: write this token's K and V into the cache
    KV_BATCH_COPY = "kv_cache_batch_copy"  # prefill: write a chunk's K and V, transposed head-major
    ADD = "add"  # residual connection
    GLU = "glu"  # act(gate) * up
    SELECT_ROWS = "select_rows"  # the rows whose logits the caller asked for, in order
    LOGITS = "logits"  # LM head over the rows the caller asks for (the last, or all), into caller memory


class Mode(Enum):
    DECODE = "decode"
    PREFILL = "prefill"


class ValueKind(Enum):
    INPUT = "input"  # filled each step from the batch (token ids, positions, sequences, rows wanted)
    WEIGHT = "weight"  # a read-only view of the GGUF file
    ACTIVATION = "activation"  # lives in the planned activation arena
    KV = "kv"  # persistent per-layer cache state
    OUTPUT = "output"  # written straight into the caller's buffer (logits); never in the arena


@dataclass(frozen=True)
class Value:
    name: str
    kind: ValueKind
    shape: tuple[int, ...]
    dtype: DType
    layer: int | None = None
    tensor: TensorInfo | None = None  # weights only: the file range this value views

    @property
    def n_elems(self) -> int:
        return prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.tensor.nbytes if self.tensor is not None else self.dtype.nbytes(self.n_elems)


@dataclass(frozen=True)
class NormAttrs:
    eps: float
    weight_offset: float


@dataclass(frozen=True)
class EmbedAttrs:
    scale: float


@dataclass(frozen=True)
class RopeAttrs:
    layout: RopeLayout
    base: float
    n_rot: int


@dataclass(frozen=True)
class AttentionAttrs:
    kind: LayerKind
    window: int | None  # local layers: a query at p sees keys in (p - window, p]
    n_head: int
    n_head_kv: int
    head_dim: int
    scale: float


@dataclass(frozen=True)
class GluAttrs:
    activation: Activation


Attrs = NormAttrs | EmbedAttrs | RopeAttrs | AttentionAttrs | GluAttrs | None

# The attrs type each op must carry (checked by the validate pass).
OP_ATTRS: dict[Op, type | None] = {
    Op.EMBED: EmbedAttrs,
    Op.RMS_NORM: NormAttrs,
    Op.MATMUL: None,
    Op.ROPE: RopeAttrs,
    Op.HADAMARD: None,
    Op.ATTENTION: AttentionAttrs,
    Op.KV_STORE: None,
    Op.KV_BATCH_COPY: None,
    Op.ADD: None,
    Op.GLU: GluAttrs,
    Op.SELECT_ROWS: None,
    Op.LOGITS: None,
}


@dataclass(frozen=True)
class Node:
    op: Op
    name: str
    layer: int | None
    inputs: tuple[Value, ...]
    outputs: tuple[Value, ...]
    attrs: Attrs = None
    kernel: str | None = None  # set by the kernel-selection pass
    scratch: Value | None = None  # working memory the kernel needs during this op only

    @property
    def label(self) -> str:
        return self.name if self.layer is None else f"{self.name}-{self.layer}"


@dataclass(frozen=True)
class Graph:
    mode: Mode
    n_tokens: int  # tokens per step the buffers are planned for (1, or the prefill chunk)
    inputs: tuple[Value, ...]
    outputs: tuple[Value, ...]
    nodes: tuple[Node, ...]

    def weights(self) -> list[Value]:
        return [v for n in self.nodes for v in n.inputs if v.kind is ValueKind.WEIGHT]

    def input(self, name: str) -> Value:
        return next(v for v in self.inputs if v.name == name)

    def activations(self) -> list[Value]:
        return [v for n in self.nodes for v in n.outputs if v.kind is ValueKind.ACTIVATION]


def _fmt_value(v: Value) -> str:
    shape = "x".join(str(d) for d in v.shape)
    return f"{v.name}:{v.dtype.label}[{shape}]"


def format_graph(g: Graph) -> str:
    """One line per node: index, label, op, kernel, outputs <- inputs."""
    lines = [
        f"graph {g.mode.value}: {len(g.nodes)} ops, n_tokens={g.n_tokens}",
        "inputs:  " + ", ".join(_fmt_value(v) for v in g.inputs),
        "outputs: " + ", ".join(_fmt_value(v) for v in g.outputs),
    ]
    width = max((len(n.label) for n in g.nodes), default=0)
    for i, n in enumerate(g.nodes):
        outs = ", ".join(_fmt_value(v) for v in n.outputs) or "-"
        ins = ", ".join(_fmt_value(v) for v in n.inputs)
        kernel = f" [{n.kernel}]" if n.kernel else ""
        lines.append(f"{i:4d}  {n.label:<{width}}  {n.op.value}{kernel}  {outs} <- {ins}")
    return "\n".join(lines) + "\n"
