"""Tiny GGUF models with random weights, written with the `gguf` writer.

They cover architectures that ship no real weights here (qwen2, qwen3, granite, phi3, gemma2, the
mixtures of experts qwen3moe and olmoe, and llama with scaled RoPE), let tests build broken files
on purpose, and give `kiln bench --synthetic` a model of any shape. The tensor set follows the arch's template (fused attn_qkv and ffn_up where
it fuses them, post-norms where it has them), so a model from this factory is exactly what that
template expects; metadata and 1-D F32 tensors the template reads only when present (RoPE
scaling, rope factors, granite's scalars, soft-caps) are the caller's, through `extra_meta` and
`extra_tensors`.

Qwen3.5 (`qwen35`: Gated DeltaNet layers, every `full_attention_interval`-th layer gated full
attention) has its own branch, written from llama.cpp's loader rather than a template, so that the
template can be checked against it. So has Gemma 4 (`gemma4`), in synthetic_gemma4.
"""
from __future__ import annotations

import math
from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType as Q

from ..frontend.architecture import LMHead, QKNormSpan
from ..frontend.architecture_file import load_architecture
from ..frontend.gguf_reader import read_model
from ..text.tokenizer import gpt2_byte_chars
from .synthetic_gemma4 import add_gemma4_meta, gemma4_qtype, gemma4_shapes, gemma4_values
from .tiny_spec import TinySpec


def _byte_vocab() -> list[str]:
    """GPT-2's printable stand-ins for the 256 byte values, then a few specials."""
    return list(gpt2_byte_chars()) + ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def tensor_shapes(s: TinySpec, n_vocab: int) -> dict[str, tuple[int, ...]]:
    """Name -> numpy-order shape of every tensor the arch's template (qwen35: llama.cpp's loader) expects."""
    shapes = gemma4_shapes(s, n_vocab) if s.arch == "gemma4" else _qwen35_shapes(s, n_vocab) if s.arch in HYBRIDS \
        else _template_shapes(s, n_vocab)
    return {k: v for k, v in (shapes | s.shapes).items() if k not in s.drop}


def _template_shapes(s: TinySpec, n_vocab: int) -> dict[str, tuple[int, ...]]:
    t = load_architecture(s.arch)
    hd = s.head_dim or s.n_embd // s.n_head
    q, kv = s.n_head * hd, s.n_head_kv * hd
    shapes: dict[str, tuple[int, ...]] = {"token_embd.weight": (n_vocab, s.n_embd), "output_norm.weight": (s.n_embd,)}
    if t.lm_head is LMHead.OUTPUT or (t.lm_head is LMHead.OUTPUT_OR_TIED
                                      and (t.qkv_bias if s.untied is None else s.untied)):
        shapes["output.weight"] = (n_vocab, s.n_embd)
    for il in range(s.n_layer):
        b = f"blk.{il}."
        shapes[b + "attn_norm.weight"] = (s.n_embd,)
        if t.fused_qkv:
            shapes[b + "attn_qkv.weight"] = (q + 2 * kv, s.n_embd)
        else:
            shapes |= {b + "attn_q.weight": (q, s.n_embd), b + "attn_k.weight": (kv, s.n_embd),
                       b + "attn_v.weight": (kv, s.n_embd)}
        shapes |= {b + "attn_output.weight": (s.n_embd, q), b + f"{t.ffn_norm_weight}.weight": (s.n_embd,)}
        if t.attn_output_bias:
            shapes[b + "attn_output.bias"] = (s.n_embd,)
        if t.attn_sinks:
            shapes[b + "attn_sinks.weight"] = (s.n_head,)
        if t.moe is not None:  # the router, then each expert's gate, up and down as one 3-D tensor
            e = s.n_expert
            shapes |= {b + "ffn_gate_inp.weight": (e, s.n_embd), b + "ffn_gate_exps.weight": (e, s.n_ff, s.n_embd),
                       b + "ffn_up_exps.weight": (e, s.n_ff, s.n_embd), b + "ffn_down_exps.weight": (e, s.n_embd, s.n_ff)}
            if t.moe.router_bias:
                shapes[b + "ffn_gate_inp.bias"] = (e,)
            if t.moe.expert_biases:  # a row of each matrix's output width an expert
                shapes |= {b + "ffn_gate_exps.bias": (e, s.n_ff), b + "ffn_up_exps.bias": (e, s.n_ff),
                           b + "ffn_down_exps.bias": (e, s.n_embd)}
        elif t.fused_ffn_up:
            shapes[b + "ffn_up.weight"] = (2 * s.n_ff, s.n_embd)
        else:
            shapes |= {b + "ffn_gate.weight": (s.n_ff, s.n_embd), b + "ffn_up.weight": (s.n_ff, s.n_embd)}
        if t.moe is None:
            shapes[b + "ffn_down.weight"] = (s.n_embd, s.n_ff)
        if t.qkv_bias:
            shapes |= {b + "attn_q.bias": (q,), b + "attn_k.bias": (kv,), b + "attn_v.bias": (kv,)}
        if t.qk_norm:  # each head's, or (OLMoE) all of a row's heads at once
            row = t.qk_norm_span is QKNormSpan.ROW
            shapes |= {b + "attn_q_norm.weight": (q if row else hd,), b + "attn_k_norm.weight": (kv if row else hd,)}
        if t.post_norms:
            shapes |= {b + "post_attention_norm.weight": (s.n_embd,), b + "post_ffw_norm.weight": (s.n_embd,)}
    return shapes


HYBRIDS = ("qwen35", "qwen35moe", "qwen3next")  # written from llama.cpp's loaders, not from their templates


def qwen35_recurrent(s: TinySpec, il: int) -> bool:
    """Whether layer il is a Gated DeltaNet layer (llama.cpp's rule without attention.recurrent_layers)."""
    return (il + 1) % s.full_attention_interval != 0


def qwen35_rope(s: TinySpec) -> tuple[int, tuple[int, int, int, int]]:
    """n_rot and the IMROPE sections. The sections default to Qwen3.5's [11, 11, 10, 0] scaled to n_rot / 2
    pairs, so that, as there, every rotated pair turns by the position for text (whose 4th position is 0)."""
    hd = s.head_dim or s.n_embd // s.n_head
    n_rot = s.n_rot or hd // 4
    if s.rope_sections is not None:
        return n_rot, tuple(s.rope_sections)
    t = round(n_rot / 2 * 11 / 32)
    return n_rot, (t, t, n_rot // 2 - 2 * t, 0)


def _qwen35_shapes(s: TinySpec, n_vocab: int) -> dict[str, tuple[int, ...]]:
    """llama.cpp's qwen35 loader: every layer has attn_norm, post_attention_norm (the FFN's pre-norm) and a
    SwiGLU FFN; a full-attention layer's attn_q holds each head's query then its output gate (2 * n_head *
    head_dim rows) and q/k norms of a head's width; a DeltaNet layer projects q, k, v at once (attn_qkv: the
    conv's channels), z (attn_gate), beta and alpha (a row a v head), with the conv's taps, dt's bias, A and
    the gated norm's weights (a head's width). Own output.weight unless `untied` is False: a tied head makes
    the next token nearly always the current one on random weights."""
    hd = s.head_dim or s.n_embd // s.n_head
    q, kv = s.n_head * hd, s.n_head_kv * hd
    key, value = s.ssm_n_group * s.ssm_d_state, s.ssm_dt_rank * s.ssm_d_state
    e = s.n_embd
    shapes: dict[str, tuple[int, ...]] = {"token_embd.weight": (n_vocab, e), "output_norm.weight": (e,)}
    if s.untied is not False:
        shapes["output.weight"] = (n_vocab, e)
    for il in range(s.n_layer):
        b = f"blk.{il}."
        shapes |= {b + "attn_norm.weight": (e,), b + "post_attention_norm.weight": (e,)}
        if qwen35_recurrent(s, il) and s.arch == "qwen3next":  # q, k, v, z and b, a fused, grouped by k head
            shapes |= {b + "ssm_in.weight": (2 * key + 2 * value, e), b + "ssm_ba.weight": (2 * s.ssm_dt_rank, e),
                       b + "ssm_conv1d.weight": (2 * key + value, s.ssm_d_conv), b + "ssm_dt.bias": (s.ssm_dt_rank,),
                       b + "ssm_a": (s.ssm_dt_rank,), b + "ssm_norm.weight": (s.ssm_d_state,),
                       b + "ssm_out.weight": (e, value)}
        elif qwen35_recurrent(s, il):
            shapes |= {b + "attn_qkv.weight": (2 * key + value, e), b + "attn_gate.weight": (value, e),
                       b + "ssm_conv1d.weight": (2 * key + value, s.ssm_d_conv), b + "ssm_dt.bias": (s.ssm_dt_rank,),
                       b + "ssm_a": (s.ssm_dt_rank,), b + "ssm_beta.weight": (s.ssm_dt_rank, e),
                       b + "ssm_alpha.weight": (s.ssm_dt_rank, e), b + "ssm_norm.weight": (s.ssm_d_state,),
                       b + "ssm_out.weight": (e, value)}
        else:
            shapes |= {b + "attn_q.weight": (2 * q, e), b + "attn_k.weight": (kv, e), b + "attn_v.weight": (kv, e),
                       b + "attn_output.weight": (e, q), b + "attn_q_norm.weight": (hd,),
                       b + "attn_k_norm.weight": (hd,)}
        if s.arch in ("qwen35moe", "qwen3next"):  # the experts (3-D), the router, the shared expert and its gate
            x = s.n_expert
            shapes |= {b + "ffn_gate_inp.weight": (x, e), b + "ffn_gate_exps.weight": (x, s.n_ff, e),
                       b + "ffn_up_exps.weight": (x, s.n_ff, e), b + "ffn_down_exps.weight": (x, e, s.n_ff),
                       b + "ffn_gate_inp_shexp.weight": (e,), b + "ffn_gate_shexp.weight": (s.n_ff, e),
                       b + "ffn_up_shexp.weight": (s.n_ff, e), b + "ffn_down_shexp.weight": (e, s.n_ff)}
        else:
            shapes |= {b + "ffn_gate.weight": (s.n_ff, e), b + "ffn_up.weight": (s.n_ff, e),
                       b + "ffn_down.weight": (e, s.n_ff)}
    return shapes


def tensor_qtype(s: TinySpec, name: str, shape: tuple[int, ...]) -> Q:
    """1-D tensors, the router and DeltaNet's conv taps stay F32, as llama.cpp's converter keeps them
    (ggml's ssm_conv reads its taps as F32 only)."""
    if s.arch == "gemma4":
        return gemma4_qtype(s, name, shape)
    matrix = len(shape) >= 2 and name.endswith(".weight") and "gate_inp" not in name and "ssm_conv1d" not in name
    qtype = s.types.get(name, s.wtype if matrix else Q.F32)
    if len(shape) >= 2 and shape[-1] % gguf.GGML_QUANT_SIZES[qtype][0]:  # rows of a part block: llama.cpp's fallback,
        qtype = FALLBACK.get(qtype, Q.F16)                                    # and F16 where that does not fit either
        return qtype if shape[-1] % gguf.GGML_QUANT_SIZES[qtype][0] == 0 else Q.F16
    return qtype


# the type llama-quantize writes where a matrix's rows are not whole super-blocks (EmbeddingGemma's FFN of
# 1152): llama-quant.cpp's tensor_type_fallback
FALLBACK = {**{q: Q.IQ4_NL for q in (Q.IQ1_S, Q.IQ1_M, Q.IQ2_XXS, Q.IQ2_XS, Q.IQ2_S, Q.IQ3_XXS, Q.IQ3_S, Q.IQ4_XS)},
            **{q: Q.Q4_0 for q in (Q.Q2_K, Q.Q3_K, Q.TQ1_0, Q.TQ2_0)}, Q.Q4_K: Q.Q5_0, Q.Q5_K: Q.Q5_1, Q.Q6_K: Q.Q8_0}


def _quantized(data: np.ndarray, qtype: Q) -> np.ndarray:
    if qtype is Q.F32:
        return data
    try:
        return gguf.quants.quantize(data, qtype)
    except (NotImplementedError, gguf.quants.QuantError):  # no numpy quantizer (the K-quants): zero blocks
        block, size = gguf.GGML_QUANT_SIZES[qtype]
        return np.zeros((*data.shape[:-1], data.shape[-1] // block * size), dtype=np.uint8)


def _values(s: TinySpec, name: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    # the LM head (tied or not) gets unit scale so that next-token distributions are peaked, as in a
    # trained model: top-1 comparisons on random weights are otherwise coin flips between near-ties
    # sinks O(1), as the scores they compete with; the experts' gate and up biases O(4), so that
    # gpt-oss's clamp at 7 bites
    scale = 1.0 if name in ("token_embd.weight", "output.weight") or name.endswith("attn_sinks.weight") else \
        4.0 if name.endswith(("gate_exps.bias", "up_exps.bias")) else 0.1
    data = rng.standard_normal(shape).astype(np.float32) * scale
    if name.endswith("norm.weight"):
        data += np.float32(s.norm_mean)
    return data


def _qwen35_values(s: TinySpec, name: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Weights under which each of qwen35's features moves the logits, and nothing overflows: norms near 1
    (as the converter stores them, HF's 1 + w folded in; norm_mean shifts them: -1 puts them near 0, as the
    other archs' default), so that every branch adds O(1) to the residual; A = -exp(A_log) in [-2, -0.1]
    and dt's bias O(1), so that a token's decay exp(softplus(alpha + dt_bias) * A) spans about 0.02 to
    0.99 (and beta 0.15 to 0.85); conv taps O(0.5), so that the three previous rows weigh as much as the
    current one; projections and the LM head as for the other archs."""
    if name.endswith(".ssm_a"):
        return -rng.uniform(0.1, 2.0, shape).astype(np.float32)
    if name.endswith("ssm_dt.bias"):
        return rng.standard_normal(shape).astype(np.float32)
    if name.endswith("ssm_conv1d.weight"):
        return rng.standard_normal(shape).astype(np.float32) * np.float32(0.5)
    if name.endswith("norm.weight"):
        return rng.standard_normal(shape).astype(np.float32) * np.float32(0.1) + np.float32(1 + s.norm_mean)
    return _values(s, name, shape, rng)


def _add_qwen35_meta(w: gguf.GGUFWriter, s: TinySpec) -> None:
    """The hyperparameters llama.cpp's qwen35 loader reads beyond the common ones."""
    n_rot, sections = qwen35_rope(s)
    w.add_rope_dimension_count(n_rot)
    if s.arch != "qwen3next":  # a plain NEOX rope there
        w.add_rope_dimension_sections(list(sections))
    w.add_ssm_conv_kernel(s.ssm_d_conv)
    w.add_ssm_inner_size(s.ssm_dt_rank * s.ssm_d_state)
    w.add_ssm_state_size(s.ssm_d_state)
    w.add_ssm_time_step_rank(s.ssm_dt_rank)
    w.add_ssm_group_count(s.ssm_n_group)
    w.add_full_attention_interval(s.full_attention_interval)
    if s.arch in ("qwen35moe", "qwen3next"):
        w.add_expert_count(s.n_expert)
        w.add_expert_used_count(s.n_expert_used)
        w.add_expert_feed_forward_length(s.n_ff)
        w.add_expert_shared_feed_forward_length(s.n_ff)


def write_tiny_model(path: Path, s: TinySpec | None = None) -> Path:
    s = s or TinySpec()
    t = None if s.arch in HYBRIDS + ("gemma4",) else load_architecture(s.arch)  # these follow llama.cpp's loader
    tok = read_model(s.tokenizer_from).tokenizer if s.tokenizer_from else None
    vocab = list(tok.tokens) if tok else _byte_vocab()
    arch = s.metadata_arch or s.arch
    w = gguf.GGUFWriter(str(path), arch)
    # not "phi3": llama.cpp gives a model so named Phi-3's own token attributes, which a borrowed vocabulary lacks
    w.add_name(f"tiny-{s.arch}".replace("phi3", "phi-three"))
    w.add_block_count(s.n_layer)
    w.add_context_length(s.context_length)
    w.add_embedding_length(s.n_embd)
    w.add_feed_forward_length(s.n_ff)
    w.add_head_count(s.n_head)
    w.add_head_count_kv(s.n_head_kv)
    w.add_rope_freq_base(s.rope_base or (10000.0 if s.arch in ("llama", "gpt-oss") else 1_000_000.0))
    w.add_layer_norm_rms_eps(1e-6)
    if s.head_dim or t is None:
        w.add_key_length(s.head_dim or s.n_embd // s.n_head)
        w.add_value_length(s.head_dim or s.n_embd // s.n_head)
    if t is None:
        (add_gemma4_meta if s.arch == "gemma4" else _add_qwen35_meta)(w, s)
    elif t.layer_pattern is not None:
        w.add_sliding_window(s.sliding_window or 8)
    if t is not None and t.moe is not None:
        w.add_expert_count(s.n_expert)
        w.add_expert_used_count(s.n_expert_used)
        if t.moe.ffn_length_key == "expert_feed_forward_length":
            w.add_expert_feed_forward_length(s.n_ff)
    if tok:
        w.add_tokenizer_model(tok.model)
        w.add_tokenizer_pre(s.tokenizer_pre or tok.pre)
        w.add_token_list(vocab)
        w.add_token_types(list(tok.token_types))
        w.add_token_merges(list(tok.merges))
        w.add_bos_token_id(tok.bos_id)
        w.add_eos_token_id(tok.eos_id)
        w.add_add_bos_token(tok.add_bos)
        if s.chat_template:
            w.add_chat_template(s.chat_template)
    else:
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("smollm")
        w.add_token_list(vocab)
        w.add_token_types([1] * 256 + [3] * 3)
        w.add_token_merges([])
        w.add_bos_token_id(256)
        w.add_eos_token_id(256)
        w.add_add_bos_token(False)

    for key, value in ((k, v) for k, v in s.extra_meta.items() if not k.startswith("synthetic.")):  # not: gemma4's
        add = {str: w.add_string, bool: w.add_bool, int: w.add_uint32, float: w.add_float32,
               list: w.add_array}[type(value)]
        add(f"{arch}.{key}", value)

    # the tensors' infos first, then their data one at a time: a model of billions of weights is
    # never held in memory whole
    planned = [(name, shape, tensor_qtype(s, name, shape)) for name, shape in tensor_shapes(s, len(vocab)).items()]
    planned += [(name, np.shape(values), Q.F32) for name, values in s.extra_tensors.items()]
    for name, shape, qtype in planned:
        block, size = gguf.GGML_QUANT_SIZES[qtype]
        w.add_tensor_info(name, shape, np.dtype(np.float32),  # an element shape, for quantized types too
                          math.prod(shape[:-1]) * (shape[-1] // block) * size, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    rng = np.random.default_rng(s.seed)
    for name, shape, qtype in planned:
        if name in s.extra_tensors:
            w.write_tensor_data(np.asarray(s.extra_tensors[name], dtype=np.float32))
            continue
        values = gemma4_values if s.arch == "gemma4" else _qwen35_values if t is None else _values
        data = values(s, name, shape, rng)
        for suffix, value in s.fill.items():  # drawn all the same, so that every other tensor keeps its values
            if name.endswith(suffix):
                data = np.broadcast_to(np.asarray(value, dtype=np.float32), shape).copy()
        w.write_tensor_data(_quantized(data, qtype))
    w.close()
    return path
