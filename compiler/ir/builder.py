"""The graph builder shared by both modes: the model's head, its blocks stage by stage, its tail.

A template's `block` lists stages; `STAGES` maps each to the function that emits its nodes.
Modes differ only in how many tokens a step carries and in what they keep for the logits.
"""
from __future__ import annotations

from math import sqrt
from typing import Callable

from ..core.dtypes import DType
from ..core.errors import ArchitectureError
from ..frontend.spec import ModelSpec
from .graph import (AttentionAttrs, Attrs, EmbedAttrs, Graph, GluAttrs, Mode, Node, NormAttrs, Op,
                  RopeAttrs, Value, ValueKind)
from ..frontend.architecture import EmbeddingScale, LayerKind, LMHead, Stage, Architecture


class GraphBuilder:
    """Emits nodes in schedule order and tracks the working values of the current block."""

    def __init__(self, spec: ModelSpec, arch: Architecture, mode: Mode, n_tokens: int):
        self.spec, self.arch, self.mode, self.T = spec, arch, mode, n_tokens
        self.hp = spec.hparams
        self.nodes: list[Node] = []
        self.layer: int | None = None
        self.tokens = Value("inp_tokens", ValueKind.INPUT, (n_tokens,), DType.I32)
        self.pos = Value("inp_pos", ValueKind.INPUT, (n_tokens,), DType.I32)  # rope positions
        self.seq = Value("inp_seq", ValueKind.INPUT, (n_tokens,), DType.I32)  # each row's sequence
        self.row = Value("inp_row", ValueKind.INPUT, (n_tokens,), DType.I32)  # its index in the sequence's cache
        self.out = Value("inp_out", ValueKind.INPUT, (n_tokens,), DType.I32)  # rows whose logits are wanted
        self.x: Value = self.tokens  # residual stream
        self.cur: Value = self.tokens  # output of the latest stage
        self.q = self.k = self.v = self.tokens

    # -- primitives -------------------------------------------------------------------------
    def weight(self, name: str, view_of: str | None = None) -> Value:
        t = self.spec.tensor(view_of or name)
        return Value(name, ValueKind.WEIGHT, t.shape, t.dtype, self.layer, t)

    def layer_weight(self, role: str, suffix: str = "weight") -> Value:
        return self.weight(f"blk.{self.layer}.{role}.{suffix}")

    def emit(self, op: Op, name: str, inputs: tuple[Value, ...], shape: tuple[int, ...], attrs: Attrs = None) -> Value:
        label = name if self.layer is None else f"{name}-{self.layer}"
        out = Value(label, ValueKind.ACTIVATION, shape, DType.F32, self.layer)
        self.nodes.append(Node(op, name, self.layer, inputs, (out,), attrs))
        return out

    def norm(self, name: str, x: Value, w: Value) -> Value:
        attrs = NormAttrs(eps=self.hp.norm_eps, weight_offset=self.arch.norm_weight_offset)
        return self.emit(Op.RMS_NORM, name, (x, w), x.shape, attrs)

    def matmul(self, name: str, x: Value, role: str, shape: tuple[int, ...], bias: bool = False) -> Value:
        inputs = (x, self.layer_weight(role)) + ((self.layer_weight(role, "bias"),) if bias else ())
        return self.emit(Op.MATMUL, name, inputs, shape)

    # -- model head and tail ----------------------------------------------------------------
    def embed(self) -> None:
        scale = sqrt(self.hp.n_embd) if self.arch.embedding_scale is EmbeddingScale.SQRT_N_EMBD else 1.0
        self.x = self.emit(Op.EMBED, "inp_embd", (self.tokens, self.weight("token_embd.weight")),
                           (self.T, self.hp.n_embd), EmbedAttrs(scale))

    def logits(self) -> None:
        self.layer = None
        x = self.norm("result_norm", self.x, self.weight("output_norm.weight"))
        x = self.emit(Op.SELECT_ROWS, "result_rows", (x, self.out), x.shape)
        tied = self.arch.lm_head is LMHead.TIED or "output.weight" not in self.spec.tensors
        head = self.weight("output.weight", view_of="token_embd.weight" if tied else None)
        logits = Value("result_output", ValueKind.OUTPUT, (self.T, self.hp.n_vocab), DType.F32)
        self.nodes.append(Node(Op.LOGITS, "result_output", None, (x, head), (logits,)))

    def blocks(self) -> None:
        for il in range(self.hp.n_layer):
            self.layer = il
            for stage in self.arch.block:
                STAGES[stage](self)

    def graph(self) -> Graph:
        logits = self.nodes[-1].outputs[0]
        inputs = (self.tokens, self.pos, self.seq, self.row, self.out)
        return Graph(self.mode, self.T, inputs, (logits,), tuple(self.nodes))


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


def _is_local(b: GraphBuilder) -> bool:
    return b.arch.layer_kind(b.layer) is LayerKind.LOCAL


def _rope(b: GraphBuilder) -> None:
    base = b.arch.rope_base_local if _is_local(b) else b.hp.rope_base
    attrs = RopeAttrs(layout=b.arch.rope_layout, base=base, n_rot=b.hp.n_rot)
    b.q = b.emit(Op.ROPE, "q_rope", (b.q, b.pos), b.q.shape, attrs)
    b.k = b.emit(Op.ROPE, "k_rope", (b.k, b.pos), b.k.shape, attrs)


def _attention(b: GraphBuilder) -> None:
    hp = b.hp
    window = None
    if _is_local(b):
        if hp.sliding_window is None:
            raise ArchitectureError(
                f"{b.spec.path}: the {b.arch.arch} architecture file makes layer {b.layer} a sliding-window layer, "
                f"but the file has no '{b.spec.arch}.attention.sliding_window'"
            )
        window = hp.sliding_window
    attrs = AttentionAttrs(kind=b.arch.layer_kind(b.layer), window=window, n_head=hp.n_head,
                           n_head_kv=hp.n_head_kv, head_dim=hp.head_dim, scale=1.0 / sqrt(hp.head_dim))
    b.cur = b.emit(Op.ATTENTION, "attn", (b.q, b.k, b.v), (b.T, hp.n_head * hp.head_dim), attrs)


def _attn_output(b: GraphBuilder) -> None:
    b.cur = b.matmul("attn_out", b.cur, "attn_output", (b.T, b.hp.n_embd))


def _attn_post_norm(b: GraphBuilder) -> None:
    b.cur = b.norm("attn_post_norm", b.cur, b.layer_weight("post_attention_norm"))


def _attn_residual(b: GraphBuilder) -> None:
    b.x = b.emit(Op.ADD, "ffn_inp", (b.cur, b.x), b.x.shape)


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
    b.x = b.emit(Op.ADD, "l_out", (b.cur, b.x), b.x.shape)


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


def build_decode(spec: ModelSpec, arch: Architecture) -> Graph:
    """Decode: one token per step."""
    b = GraphBuilder(spec, arch, Mode.DECODE, n_tokens=1)
    b.embed()
    b.blocks()
    b.logits()
    return b.graph()


def build_prefill(spec: ModelSpec, arch: Architecture, batch_tokens: int) -> Graph:
    """The batch step: up to `batch_tokens` rows of any sequences (prefill chunks beside decode
    tokens). Buffers are planned for a full batch. The LM head runs on the rows the caller asks
    for (the last, or all) and writes straight into the caller's logits buffer, so the arena never
    holds [chunk, vocab]."""
    b = GraphBuilder(spec, arch, Mode.PREFILL, n_tokens=batch_tokens)
    b.embed()
    b.blocks()
    b.logits()
    return b.graph()
