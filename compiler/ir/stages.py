"""The block stages: each expands one stage of an architecture's block (frontend/architecture.py's
Stage) into IR nodes on a GraphBuilder, as llama.cpp's graph builds that part of a layer. STAGES
maps every stage to its function.
"""
from __future__ import annotations

from math import sqrt
from typing import Callable

import numpy as np

from ..core.dtypes import DType
from ..core.errors import ModelFileError
from ..frontend.architecture import Activation, LayerKind, QKNormSpan, RopeFactors, Scalar, Stage
from .emitter import GraphBuilder
from .graph import (AttentionAttrs, ConvAttrs, DeltaNetAttrs, GluAttrs, MoeAttrs, Node, Op, RopeAttrs,
                    RouteAttrs, ScaleAttrs, Value, ValueKind)
from .rope import rope_attrs
from .stages_encoder import attn_out_norm, ffn_up, layer_out_norm


def _attn_norm(b: GraphBuilder) -> None:
    b.cur = b.norm("attn_norm", b.x, b.layer_weight("attn_norm"))


def _qkv(b: GraphBuilder) -> None:
    hp, nq, nkv = b.hp, b.hp.n_head * b.hp.head_dim, b.hp.n_head_kv * b.hp.head_dim
    q, k, v = "attn_q", "attn_k", "attn_v"
    qb = kb = vb = b.arch.qkv_bias  # each projection's own bias, where the template has them
    if b.arch.fused_qkv:  # llama.cpp's views of attn_qkv: Q's rows, K's, V's (and of its bias)
        q, k, v = b.fused("blk.0.attn_qkv.weight", ((q, nq), (k, nkv), (v, nkv)))
        if b.arch.qkv_bias:
            qb, kb, vb = b.fused("blk.0.attn_qkv.bias", (("attn_q_bias", nq), ("attn_k_bias", nkv), ("attn_v_bias", nkv)))
    if b.arch.attn_output_gate:  # each head's query, then its gate: split them apart
        qg = b.matmul("q_gated", b.cur, q, (b.T, hp.n_head, 2 * hp.head_dim), qb)
        b.q, b.gate = b.regroup("q", qg, hp.n_head, (hp.head_dim, hp.head_dim), ((0,), (1,)),
                                (("q", (b.T, hp.n_head, hp.head_dim)), ("attn_gate", (b.T, hp.n_head * hp.head_dim))))
    else:
        b.q = b.matmul("q", b.cur, q, (b.T, hp.n_head, hp.head_dim), qb)
    if not b.owns_kv:  # it attends to another layer's KV (shared_kv)
        b.k = b.v = None
        return
    b.k = b.matmul("k", b.cur, k, (b.T, hp.n_head_kv, hp.head_dim), kb)
    if b.arch.k_as_v and not b.has("blk.0.attn_v.weight"):  # K's projection, normed apart (qk_norm)
        b.v = b.k
    else:
        b.v = b.matmul("v", b.cur, v, (b.T, hp.n_head_kv, hp.head_dim), vb)


def _qk_norm(b: GraphBuilder) -> None:
    """Each head's norm, or (OLMoE) one over all of a row's heads: the norm takes runs of its weight's
    length. V's, where the template norms it, has no weight (Gemma 4)."""
    v = b.v
    for name, x, heads in (("q", b.q, b.hp.n_head), ("k", b.k, b.hp.n_head_kv)):
        if x is None:  # a layer that keeps no KV has no K
            continue
        w = b.layer_weight(f"attn_{name}_norm")
        span = b.hp.head_dim * (heads if b.arch.qk_norm_span is QKNormSpan.ROW else 1)
        if w.shape != (span,):
            raise ModelFileError(f"{b.spec.path}: tensor 'blk.0.attn_{name}_norm.weight' is {list(w.shape)}; the "
                                 f"{b.arch.arch} architecture normalizes runs of {span} (qk_norm_span "
                                 f"'{b.arch.qk_norm_span.value}')")
        setattr(b, name, b.norm(f"{name}_norm", x, w))
    if b.arch.v_norm and v is not None:
        b.v = b.norm("v_norm", v, None)


def _rope(b: GraphBuilder) -> None:
    attrs = rope_attrs(b.hp, b.arch.rope_layout) if b.arch.rope_scaling else RopeAttrs(b.arch.rope_layout, b.hp.n_rot)
    # the factors: every layer's, or (freqs_global) the global layers' alone
    factors = b.factors if b.arch.rope_factors is not RopeFactors.FREQS_GLOBAL or \
        b.kinds[b.first] is LayerKind.GLOBAL else None

    def inputs(x: Value, role: str) -> tuple[Value, ...]:
        # the factors are one file tensor, bound to a role of each rope (a weight value has one reader)
        return (x, b.inputs["inp_pos"]) + ((b.bind(role, factors),) if factors else ())
    b.q = b.emit(Op.ROPE, "q_rope", inputs(b.q, "rope_factors_q"), b.q.shape, attrs)
    if b.k is not None:
        b.k = b.emit(Op.ROPE, "k_rope", inputs(b.k, "rope_factors_k"), b.k.shape, attrs)


def _attention_scale(b: GraphBuilder) -> float:
    rule, hp = b.arch.attention_scale, b.hp
    if rule.rule == "metadata" and b.scalar("attention.scale"):
        return b.scalar("attention.scale")
    if rule.rule == "n_embd_per_head_at_layers" and hp.n_layer == rule.layers:
        return float(np.float32(1) / np.sqrt(np.float32(hp.n_embd // hp.n_head)))
    if rule.rule == "unit":
        return 1.0
    return 1.0 / sqrt(hp.head_dim)


def _attention(b: GraphBuilder) -> None:
    hp = b.hp
    attrs = AttentionAttrs(n_head=hp.n_head, n_head_kv=hp.n_head_kv, head_dim=hp.head_dim, scale=_attention_scale(b),
                           softcap=b.arch.softcap_value("attn_softcap", b.hp.scalar("attn_logit_softcapping")),
                           alibi=b.arch.alibi_max_bias or 0.0)
    sinks = ()
    if b.arch.attn_sinks:  # one logit a head, in every softmax's denominator
        t = b.first_tensor("blk.0.attn_sinks.weight")
        if t.shape != (hp.n_head,) or t.dtype is not DType.F32:
            raise ModelFileError(f"{b.spec.path}: tensor '{t.name}' is {t.dtype.name} {list(t.shape)}; attention "
                                 f"sinks are one F32 logit per head ({hp.n_head})")
        sinks = (b.layer_weight("attn_sinks"),)
    kv = (b.k, b.v) if b.owns_kv else ()  # a layer that keeps no KV reads its source's (kv_insert)
    b.cur = b.emit(Op.ATTENTION, "attn", (b.q, *kv, *sinks), (b.T, hp.n_head * hp.head_dim), attrs)


def _residual(b: GraphBuilder, name: str, scaled: str) -> None:
    by = b.scalar("residual_scale") if b.arch.residual_scale is Scalar.METADATA else 0.0
    b.add_into_x(name, b.scale(scaled, b.cur, by) if by not in (0.0, 1.0) else b.cur)


def _attn_output(b: GraphBuilder) -> None:
    if b.arch.attn_output_gate:
        b.cur = b.emit(Op.GLU, "attn_gated", (b.gate, b.cur), b.cur.shape, GluAttrs(Activation.SIGMOID))
    b.cur = b.matmul("attn_out", b.cur, "attn_output", (b.T, b.hp.n_embd), b.arch.attn_output_bias)


def _attn_post_norm(b: GraphBuilder) -> None:
    b.cur = b.norm("attn_post_norm", b.cur, b.layer_weight("post_attention_norm"))


def _attn_residual(b: GraphBuilder) -> None:
    _residual(b, "ffn_inp", "attn_scaled")


def _ffn_norm(b: GraphBuilder) -> None:
    b.cur = b.ffn_in = b.norm("ffn_norm", b.x, b.layer_weight(b.arch.ffn_norm_weight))


def _ffn_glu(b: GraphBuilder) -> None:
    shape, n_ff = (b.T, b.hp.n_ff), b.hp.n_ff
    if b.arch.fused_ffn_up:  # ffn_up holds the gate's rows, then up's (ggml_swiglu's halves), its bias too
        gate_w, up_w = b.fused("blk.0.ffn_up.weight", (("ffn_gate", n_ff), ("ffn_up", n_ff)))
        gate_b, up_b = b.fused("blk.0.ffn_up.bias", (("ffn_gate_bias", n_ff), ("ffn_up_bias", n_ff))) \
            if b.arch.ffn_bias else (False, False)
    else:  # llama.cpp's BERT family: a bias on up alone
        gate_w, up_w, gate_b, up_b = "ffn_gate", "ffn_up", False, b.arch.ffn_bias
    gate = b.matmul("ffn_gate", b.cur, gate_w, shape, gate_b)
    up = b.matmul("ffn_up", b.cur, up_w, shape, up_b)
    b.cur = b.emit(Op.GLU, "ffn_glu", (gate, up), shape, GluAttrs(b.arch.activation))


def _ffn_down(b: GraphBuilder) -> None:
    b.cur = b.matmul("ffn_out", b.cur, "ffn_down", (b.T, b.hp.n_embd), b.arch.ffn_bias)


def _ffn_moe(b: GraphBuilder) -> None:
    """Router logits (a matmul), each row's top-k experts and their weights (moe_route), then the
    experts' FFNs weighted and summed (moe_ffn), as llama.cpp's build_moe_ffn names them."""
    hp, moe = b.hp, b.arch.moe
    n_exp, k, n_ff, n_embd = hp.n_expert, hp.n_expert_used, hp.n_ff_exp, hp.n_embd
    parts = ("gate", "up", "down")[b.arch.activation is Activation.GELU:]  # a plain GELU expert has no gate
    matrix = {"gate": (n_ff, n_embd), "up": (n_ff, n_embd), "down": (n_embd, n_ff)}  # an expert's slice of each
    expected = {"ffn_gate_inp": (n_exp, n_embd)} | {f"ffn_{p}_exps": (n_exp, *matrix[p]) for p in parts}
    if moe.expert_biases:  # a row of each expert's output width an expert
        expected |= {f"ffn_{p}_exps.bias": (n_exp, matrix[p][0]) for p in parts}
    if moe.router_bias:
        expected["ffn_gate_inp.bias"] = (n_exp,)
    for role, shape in expected.items():
        t = b.first_tensor(f"blk.0.{role}" + ("" if role.endswith(".bias") else ".weight"))
        bias = role.endswith(".bias")
        if t.shape != shape or (bias and t.dtype is not DType.F32):
            raise ModelFileError(f"{b.spec.path}: tensor '{t.name}' is {t.dtype.name + ' ' if bias else ''}"
                                 f"{list(t.shape)} but expert_count {n_exp}, an expert's FFN width {n_ff} "
                                 f"({moe.ffn_length_key}) and n_embd {n_embd} make it {list(shape)}"
                                 + (" of F32" if bias else ""))
    logits = b.matmul("ffn_moe_logits", b.cur, "ffn_gate_inp", (b.T, n_exp), moe.router_bias)
    ids, weights = _route(b, logits, RouteAttrs(n_exp, k, moe.normalize, moe.gating == "softmax_weight"))
    experts = tuple(b.layer_weight(f"ffn_{p}_exps") for p in parts)
    biases = tuple(b.layer_weight(f"ffn_{p}_exps", "bias") for p in parts) if moe.expert_biases else ()
    b.cur = b.emit(Op.MOE_FFN, "ffn_moe_out", (b.cur, ids, weights, *experts, *biases), (b.T, n_embd),
                   MoeAttrs(n_exp, k, b.arch.activation, parts + tuple(f"{p}_b" for p in parts if biases)))


def _route(b: GraphBuilder, logits: Value, attrs: RouteAttrs) -> tuple[Value, Value]:
    """Each row's top-k experts and their weights from the router's logits (moe_route)."""
    ids = Value("ffn_moe_topk", ValueKind.ACTIVATION, (b.T, attrs.n_used), DType.I32)
    weights = Value("ffn_moe_weights", ValueKind.ACTIVATION, (b.T, attrs.n_used), DType.F32)
    b.nodes.append(Node(Op.MOE_ROUTE, "ffn_moe_topk", (logits,), (ids, weights), attrs))
    return ids, weights


def _delta_net(b: GraphBuilder) -> None:
    """A Gated DeltaNet (llama.cpp's qwen35 build_layer_attn_linear): q, k and v projected together
    (attn_qkv), a causal conv over them and SiLU (ssm_conv1d; each sequence keeps its last inputs),
    the per-head decay and write strength from ssm_alpha and ssm_beta, the delta rule on each value
    head's state and its read-out (delta_net), RMSNorm of each head times SiLU(z) (attn_gate's z),
    and ssm_out."""
    hp, ssm = b.hp, b.hp.ssm
    T, n_v, n_k, d = b.T, ssm.n_v_heads, ssm.n_k_heads, ssm.d_state
    r = n_v // n_k
    grouped = b.has("blk.0.ssm_in.weight")  # Qwen3-Next's q, k, v, z in one matrix, grouped by key head
    fused_ba = b.has("blk.0.ssm_ba.weight")  # and its beta and alpha, grouped the same way
    projections = {"ssm_in": (2 * ssm.key_dim + 2 * ssm.value_dim, hp.n_embd)} if grouped else {
        "attn_qkv": (ssm.conv_dim, hp.n_embd), "attn_gate": (ssm.value_dim, hp.n_embd)}
    projections |= {"ssm_ba": (2 * n_v, hp.n_embd)} if fused_ba else {
        "ssm_alpha": (n_v, hp.n_embd), "ssm_beta": (n_v, hp.n_embd)}
    expected = {**projections, "ssm_conv1d": (ssm.conv_dim, ssm.d_conv), "ssm_norm": (d,),
                "ssm_out": (hp.n_embd, ssm.value_dim)}
    for role, shape in expected.items():
        t = b.first_tensor(f"blk.0.{role}.weight")
        if t.shape != shape:
            raise ModelFileError(f"{b.spec.path}: tensor '{t.name}' is {list(t.shape)} but the ssm.* sizes make it "
                                 f"{list(shape)}")
    for name in ("ssm_a", "ssm_dt.bias"):
        t = b.first_tensor(f"blk.0.{name}")
        if t.shape != (n_v,) or t.dtype is not DType.F32:
            raise ModelFileError(f"{b.spec.path}: tensor '{t.name}' is {t.dtype.name} {list(t.shape)}; the DeltaNet "
                                 f"reads one F32 per value head ({n_v})")
    if grouped:  # per key head: q, k, its r value heads' v, their z (llama.cpp's legacy path's views)
        mixed = b.matmul("linear_attn_mixed_qkvz", b.cur, "ssm_in", (T, n_k, 2 * d + 2 * r * d))
        qkv, z = b.regroup("linear_attn_qkv_mixed", mixed, n_k, (d, d, r * d, r * d), ((0, 1, 2), (3,)),
                           (("linear_attn_qkv_mixed", (T, ssm.conv_dim)), ("z", (T, ssm.value_dim))))
    else:
        qkv = b.matmul("linear_attn_qkv_mixed", b.cur, "attn_qkv", (T, ssm.conv_dim))
        z = b.matmul("z", b.cur, "attn_gate", (T, ssm.value_dim))
    if fused_ba:  # per key head: its r value heads' beta, then their alpha
        mixed = b.matmul("linear_attn_mixed_ba", b.cur, "ssm_ba", (T, n_k, 2 * r))
        beta, alpha = b.regroup("linear_attn_ba", mixed, n_k, (r, r), ((0,), (1,)),
                                (("beta", (T, n_v)), ("alpha", (T, n_v))))
    else:
        beta = b.matmul("beta", b.cur, "ssm_beta", (T, n_v))
        alpha = b.matmul("alpha", b.cur, "ssm_alpha", (T, n_v))
    seq, row = b.inputs["inp_seq"], b.inputs["inp_row"]
    conv_state = Value("conv_state", ValueKind.RECURRENT, (ssm.d_conv - 1, ssm.conv_dim), DType.F32)
    conv = b.emit(Op.SSM_CONV, "conv_output_silu", (qkv, b.layer_weight("ssm_conv1d"), seq, row, conv_state),
                  qkv.shape, ConvAttrs(ssm.d_conv))
    delta_state = Value("delta_state", ValueKind.RECURRENT, (n_v, ssm.d_state, ssm.d_state), DType.F32)
    a, dt = b.bind("ssm_a", "blk.0.ssm_a"), b.bind("ssm_dt", "blk.0.ssm_dt.bias")
    out = b.emit(Op.DELTA_NET, "delta_net", (conv, alpha, beta, dt, a, seq, row, delta_state),
                 (T, n_v, ssm.d_state), DeltaNetAttrs(ssm.n_k_heads, n_v, ssm.d_state, hp.norm_eps,
                                                      b.arch.head_pairing == "interleaved"))
    normed = b.norm("attn_out_norm", out, b.layer_weight("ssm_norm"))
    gated = b.emit(Op.GLU, "final_output", (z, normed), (T, ssm.value_dim), GluAttrs(Activation.SWIGLU))
    b.cur = b.matmul("linear_attn_out", gated, "ssm_out", (T, hp.n_embd))


def _ffn_shared_expert(b: GraphBuilder) -> None:
    """llama.cpp's qwen35moe / qwen3next build_layer_ffn: a SwiGLU FFN of expert_shared_feed_forward_length
    on the FFN's input, times sigmoid of one logit a row (ffn_gate_inp_shexp, a vector of n_embd read
    as a matrix of one row), added to the experts' output."""
    hp, x, T = b.hp, b.ffn_in, b.T
    n_ff = b.first_tensor("blk.0.ffn_gate_shexp.weight").shape[0]
    t = b.first_tensor("blk.0.ffn_gate_inp_shexp.weight")
    if t.shape != (hp.n_embd,) or t.dtype is not DType.F32:
        raise ModelFileError(f"{b.spec.path}: tensor '{t.name}' is {t.dtype.name} {list(t.shape)}; the shared "
                             f"expert's gate is one F32 weight per embedding dim ({hp.n_embd})")
    gate = b.matmul("ffn_gate_shexp", x, "ffn_gate_shexp", (T, n_ff))
    up = b.matmul("ffn_up_shexp", x, "ffn_up_shexp", (T, n_ff))
    h = b.emit(Op.GLU, "ffn_glu_shexp", (gate, up), (T, n_ff), GluAttrs(Activation.SWIGLU))
    shexp = b.matmul("ffn_shexp", h, "ffn_down_shexp", (T, hp.n_embd))
    logit = b.matmul("shared_expert_gate", x, b.bind("ffn_gate_inp_shexp", "blk.0.ffn_gate_inp_shexp.weight",
                                                      as_row=True), (T, 1))
    gated = b.emit(Op.GLU, "ffn_shexp_gated", (logit, shexp), shexp.shape, GluAttrs(Activation.SIGMOID))
    b.cur = b.emit(Op.ADD, "ffn_out", (b.cur, gated), shexp.shape)


def _per_layer_embedding(b: GraphBuilder) -> None:
    """Gemma 4's: the layer's slice of the head's inp_per_layer (emitter.head), times
    gelu(per_layer_inp_gate . x) (a GeGLU), projected back to n_embd (per_layer_proj), normed
    (per_layer_post_norm), added to the residual. None where the file has none (26B-A4B, 31B)."""
    p, T = b.hp.n_embd_per_layer, b.T
    if not p:
        return
    mine = b.emit(Op.LAYER_SLICE, "inp_this_layer", (b.per_layer,), (T, p))
    gate = b.matmul("per_layer_gate", b.x, "inp_gate", (T, p))
    gated = b.emit(Op.GLU, "per_layer_gated", (gate, mine), (T, p), GluAttrs(Activation.GEGLU))
    out = b.matmul("per_layer_out", gated, "proj", (T, b.hp.n_embd))
    b.add_into_x("per_layer_embd_out", b.norm("per_layer_post_norm", out, b.layer_weight("post_norm")))


def _layer_output_scale(b: GraphBuilder) -> None:
    """The whole residual times the layer's layer_output_scale (Gemma 4), in place, where the file has it."""
    if not b.has("blk.0.layer_output_scale.weight"):
        return
    t = b.first_tensor("blk.0.layer_output_scale.weight")
    if t.shape != (1,) or t.dtype is not DType.F32:
        raise ModelFileError(f"{b.spec.path}: tensor '{t.name}' is {t.dtype.name} {list(t.shape)}; a layer's output "
                             "scale is one F32")
    b.nodes.append(Node(Op.SCALE, "out_scaled", (b.x, b.layer_weight("layer_output_scale")), (b.x,), ScaleAttrs(1.0)))


def _ffn_moe_beside(b: GraphBuilder) -> None:
    """Gemma 4's 26B-A4B (llama.cpp's gemma4 graph), in a layer with a router: the dense FFN's
    output normed (post_ffw_norm_1) is the shared MLP's; beside it the experts, on the attention's
    output normed by pre_ffw_norm_2, routed by ffn_gate_inp on that output RMS-normed without a
    weight, times 1/sqrt(n_embd) and ffn_gate_inp.scale (softmax, the top k renormalized); GeGLU
    experts (gate and up in one tensor, ffn_gate_up_exps, or apart), each expert's output times its
    ffn_down_exps.scale; their sum normed (post_ffw_norm_2) and added to the MLP's."""
    if not b.has("blk.0.ffn_gate_inp.weight"):
        return
    hp, T = b.hp, b.T
    n_exp, k, n_embd = hp.n_expert, hp.n_expert_used, hp.n_embd
    if not n_exp:
        raise ModelFileError(f"{b.spec.path}: layer {b.first} has a router (ffn_gate_inp) but the file has no "
                             f"'{b.spec.arch}.expert_count'")
    mlp = b.norm("ffn_mlp", b.cur, b.layer_weight("post_ffw_norm_1"))
    moe_in = b.norm("ffn_norm_2", b.x, b.layer_weight("pre_ffw_norm_2"))
    r = b.scale("ffn_router_scaled", b.norm("ffn_router_norm", b.x, None),
                float(np.float32(1) / np.sqrt(np.float32(n_embd))))
    r = b.emit(Op.SCALE, "ffn_router_in", (r, b.layer_weight("ffn_gate_inp", "scale")), r.shape, ScaleAttrs(1.0))
    logits = b.matmul("ffn_moe_logits", r, "ffn_gate_inp", (T, n_exp))
    ids, weights = _route(b, logits, RouteAttrs(n_exp, k, True))
    parts = ("gate_up", "down") if b.has("blk.0.ffn_gate_up_exps.weight") else ("gate", "up", "down")
    if b.has("blk.0.ffn_down_exps.scale"):
        parts += ("down_scale",)
    experts = tuple(b.layer_weight(f"ffn_{p}_exps") if p != "down_scale" else b.layer_weight("ffn_down_exps", "scale")
                    for p in parts)
    out = b.emit(Op.MOE_FFN, "ffn_moe_out", (moe_in, ids, weights, *experts), (T, n_embd),
                 MoeAttrs(n_exp, k, Activation.GEGLU, parts))
    moe = b.norm("ffn_moe", out, b.layer_weight("post_ffw_norm_2"))
    b.cur = b.emit(Op.ADD, "ffn_moe_combined", (mlp, moe), mlp.shape)


def _ffn_post_norm(b: GraphBuilder) -> None:
    b.cur = b.norm("ffn_post_norm", b.cur, b.layer_weight("post_ffw_norm"))


def _ffn_residual(b: GraphBuilder) -> None:
    _residual(b, "l_out", "ffn_scaled")


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
    Stage.FFN_MOE: _ffn_moe,
    Stage.FFN_POST_NORM: _ffn_post_norm,
    Stage.FFN_RESIDUAL: _ffn_residual,
    Stage.DELTA_NET: _delta_net,
    Stage.FFN_SHARED_EXPERT: _ffn_shared_expert,
    Stage.PER_LAYER_EMBEDDING: _per_layer_embedding,
    Stage.LAYER_OUTPUT_SCALE: _layer_output_scale,
    Stage.FFN_MOE_BESIDE: _ffn_moe_beside,
    Stage.FFN_UP: ffn_up,
    Stage.ATTN_OUT_NORM: attn_out_norm,
    Stage.LAYER_OUT_NORM: layer_out_norm,
}
assert set(STAGES) == set(Stage)
