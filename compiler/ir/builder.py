"""Build the step graph of a model: the head, one layer's body stage by stage, the tail.

An architecture's `block` lists stages; `STAGES` maps each to the function that emits its nodes.
The body is built once, from layer 0's tensors; every layer must then have a tensor of the same
shape for every role the body uses, and `Graph.layers` records which (with each layer's kind,
window and rope base).
"""
from __future__ import annotations

from math import sqrt
from typing import Callable

from ..core.dtypes import DType
from ..core.errors import ArchitectureError, ModelFileError
from ..frontend.architecture import Architecture, EmbeddingScale, LayerKind, LMHead, Stage
from ..frontend.spec import ModelSpec, TensorInfo
from .graph import (AttentionAttrs, Attrs, EmbedAttrs, Graph, GluAttrs, Layer, Node, NormAttrs, Op, RopeAttrs,
                    Value, ValueKind)

# The step's inputs: the batch's arrays, one entry per row.
INPUTS = (
    ("inp_tokens", "token ids"),
    ("inp_pos", "rope positions"),
    ("inp_seq", "each row's sequence"),
    ("inp_row", "each row's index in its sequence's cache"),
    ("inp_out", "the rows whose logits are wanted"),
)


class GraphBuilder:
    """Emits nodes in schedule order and tracks the working values of the current stage."""

    def __init__(self, spec: ModelSpec, arch: Architecture, n_tokens: int):
        self.spec, self.arch, self.T = spec, arch, n_tokens
        self.hp = spec.hparams
        self.nodes: list[Node] = []
        self.roles: dict[str, str] = {}  # role -> its tensor's name in layer 0
        self.inputs = {name: Value(name, ValueKind.INPUT, (n_tokens,), DType.I32) for name, _ in INPUTS}
        self.x = Value("x", ValueKind.STATE, (n_tokens, self.hp.n_embd), DType.F32)  # the residual stream
        self.cur = self.q = self.k = self.v = self.x  # outputs of the latest stages

    # -- primitives -------------------------------------------------------------------------
    def weight(self, name: str, view_of: str | None = None) -> Value:
        t = self.spec.tensor(view_of or name)
        return Value(name, ValueKind.WEIGHT, t.shape, t.dtype, t)

    def layer_weight(self, name: str, suffix: str = "weight") -> Value:
        role = name if suffix == "weight" else f"{name}_{suffix}"
        tensor = f"blk.0.{name}.{suffix}"
        self.roles[role] = tensor
        return Value(role, ValueKind.WEIGHT, self.spec.tensor(tensor).shape, None)

    def emit(self, op: Op, name: str, inputs: tuple[Value, ...], shape: tuple[int, ...], attrs: Attrs = None) -> Value:
        out = Value(name, ValueKind.ACTIVATION, shape, DType.F32)
        self.nodes.append(Node(op, name, inputs, (out,), attrs))
        return out

    def add_into_x(self, name: str, y: Value) -> None:
        self.nodes.append(Node(Op.ADD, name, (y, self.x), (self.x,)))

    def norm(self, name: str, x: Value, w: Value) -> Value:
        attrs = NormAttrs(eps=self.hp.norm_eps, weight_offset=self.arch.norm_weight_offset)
        return self.emit(Op.RMS_NORM, name, (x, w), x.shape, attrs)

    def matmul(self, name: str, x: Value, role: str, shape: tuple[int, ...], bias: bool = False) -> Value:
        inputs = (x, self.layer_weight(role)) + ((self.layer_weight(role, "bias"),) if bias else ())
        return self.emit(Op.MATMUL, name, inputs, shape)

    def take(self) -> tuple[Node, ...]:
        nodes, self.nodes = tuple(self.nodes), []
        return nodes

    # -- head, body, tail --------------------------------------------------------------------
    def head(self) -> tuple[Node, ...]:
        scale = sqrt(self.hp.n_embd) if self.arch.embedding_scale is EmbeddingScale.SQRT_N_EMBD else 1.0
        self.nodes.append(Node(Op.EMBED, "inp_embd", (self.inputs["inp_tokens"], self.weight("token_embd.weight")),
                               (self.x,), EmbedAttrs(scale)))
        return self.take()

    def body(self) -> tuple[Node, ...]:
        for stage in self.arch.block:
            STAGES[stage](self)
        return self.take()

    def tail(self) -> tuple[Node, ...]:
        x = self.norm("result_norm", self.x, self.weight("output_norm.weight"))
        x = self.emit(Op.SELECT_ROWS, "result_rows", (x, self.inputs["inp_out"]), x.shape)
        tied = self.arch.lm_head is LMHead.TIED or "output.weight" not in self.spec.tensors
        head = self.weight("output.weight", view_of="token_embd.weight" if tied else None)
        logits = Value("result_output", ValueKind.OUTPUT, (self.T, self.hp.n_vocab), DType.F32)
        self.nodes.append(Node(Op.LOGITS, "result_output", (x, head), (logits,)))
        return self.take()

    def layers(self) -> tuple[Layer, ...]:
        out = []
        for il in range(self.hp.n_layer):
            kind = self.arch.layer_kind(il)
            window = None
            if kind is LayerKind.LOCAL:
                if self.hp.sliding_window is None:
                    raise ArchitectureError(
                        f"{self.spec.path}: the {self.arch.arch} architecture makes layer {il} a sliding-window "
                        f"layer, but the file has no '{self.spec.arch}.attention.sliding_window'")
                window = self.hp.sliding_window
            base = self.arch.rope_base_local if kind is LayerKind.LOCAL else self.hp.rope_base
            out.append(Layer(il, kind, window, base, {role: self._layer_tensor(il, role, t0)
                                                      for role, t0 in self.roles.items()}))
        return tuple(out)

    def _layer_tensor(self, il: int, role: str, name0: str) -> TensorInfo:
        t = self.spec.tensor(name0.replace("blk.0.", f"blk.{il}.", 1))
        t0 = self.spec.tensor(name0)
        if t.shape != t0.shape:
            raise ModelFileError(f"{self.spec.path}: tensor '{t.name}' is {list(t.shape)} but '{name0}' is "
                                 f"{list(t0.shape)}; every layer must have the same shapes")
        return t


def build_graph(spec: ModelSpec, arch: Architecture, n_tokens: int) -> Graph:
    """The step graph for batches of up to n_tokens rows."""
    b = GraphBuilder(spec, arch, n_tokens)
    head, body, tail = b.head(), b.body(), b.tail()
    return Graph(n_tokens, tuple(b.inputs.values()), (b.x,), tail[-1].outputs, head, body, tail, b.layers())


# -- block stages ---------------------------------------------------------------------------
def _attn_norm(b: GraphBuilder) -> None:
    b.cur = b.norm("attn_norm", b.x, b.layer_weight("attn_norm"))


def _qkv(b: GraphBuilder) -> None:
    hp, bias = b.hp, b.arch.qkv_bias
    b.q = b.matmul("q", b.cur, "attn_q", (b.T, hp.n_head, hp.head_dim), bias)
    b.k = b.matmul("k", b.cur, "attn_k", (b.T, hp.n_head_kv, hp.head_dim), bias)
    b.v = b.matmul("v", b.cur, "attn_v", (b.T, hp.n_head_kv, hp.head_dim), bias)


def _qk_norm(b: GraphBuilder) -> None:
    b.q = b.norm("q_norm", b.q, b.layer_weight("attn_q_norm"))
    b.k = b.norm("k_norm", b.k, b.layer_weight("attn_k_norm"))


def _rope(b: GraphBuilder) -> None:
    attrs = RopeAttrs(layout=b.arch.rope_layout, n_rot=b.hp.n_rot)
    b.q = b.emit(Op.ROPE, "q_rope", (b.q, b.inputs["inp_pos"]), b.q.shape, attrs)
    b.k = b.emit(Op.ROPE, "k_rope", (b.k, b.inputs["inp_pos"]), b.k.shape, attrs)


def _attention(b: GraphBuilder) -> None:
    hp = b.hp
    attrs = AttentionAttrs(n_head=hp.n_head, n_head_kv=hp.n_head_kv, head_dim=hp.head_dim,
                           scale=1.0 / sqrt(hp.head_dim))
    b.cur = b.emit(Op.ATTENTION, "attn", (b.q, b.k, b.v), (b.T, hp.n_head * hp.head_dim), attrs)


def _attn_output(b: GraphBuilder) -> None:
    b.cur = b.matmul("attn_out", b.cur, "attn_output", (b.T, b.hp.n_embd))


def _attn_post_norm(b: GraphBuilder) -> None:
    b.cur = b.norm("attn_post_norm", b.cur, b.layer_weight("post_attention_norm"))


def _attn_residual(b: GraphBuilder) -> None:
    b.add_into_x("ffn_inp", b.cur)


def _ffn_norm(b: GraphBuilder) -> None:
    b.cur = b.norm("ffn_norm", b.x, b.layer_weight("ffn_norm"))


def _ffn_glu(b: GraphBuilder) -> None:
    shape = (b.T, b.hp.n_ff)
    gate = b.matmul("ffn_gate", b.cur, "ffn_gate", shape)
    up = b.matmul("ffn_up", b.cur, "ffn_up", shape)
    b.cur = b.emit(Op.GLU, "ffn_glu", (gate, up), shape, GluAttrs(b.arch.activation))


def _ffn_down(b: GraphBuilder) -> None:
    b.cur = b.matmul("ffn_out", b.cur, "ffn_down", (b.T, b.hp.n_embd))


def _ffn_post_norm(b: GraphBuilder) -> None:
    b.cur = b.norm("ffn_post_norm", b.cur, b.layer_weight("post_ffw_norm"))


def _ffn_residual(b: GraphBuilder) -> None:
    b.add_into_x("l_out", b.cur)


STAGES: dict[Stage, Callable[[GraphBuilder], None]] = {
    Stage.ATTN_NORM: _attn_norm,
    Stage.QKV: _qkv,
    Stage.QK_NORM: _qk_norm,
    Stage.ROPE: _rope,
    Stage.ATTENTION: _attention,
    Stage.ATTN_OUTPUT: _attn_output,
    Stage.ATTN_POST_NORM: _attn_post_norm,
    Stage.ATTN_RESIDUAL: _attn_residual,
    Stage.FFN_NORM: _ffn_norm,
    Stage.FFN_GLU: _ffn_glu,
    Stage.FFN_DOWN: _ffn_down,
    Stage.FFN_POST_NORM: _ffn_post_norm,
    Stage.FFN_RESIDUAL: _ffn_residual,
}
assert set(STAGES) == set(Stage)
