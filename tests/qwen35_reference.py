"""An exact forward pass of a qwen35 GGUF (Qwen3.5: Gated DeltaNet layers, every
full_attention_interval-th layer gated full attention), a referee neither engine wrote.

It follows llama.cpp's graph (src/models/qwen35.cpp, delta-net-base.cpp) and ggml's CPU ops
(ssm_conv, gated_delta_net, rope in IMROPE mode), not kiln's code. Every weight is dequantized by
`gguf.quants`, and everything after runs in float64. What it takes from llama.cpp:

- RMSNorm is x / sqrt(mean(x^2) + eps) * w everywhere (the converter folds HF's 1 + w into w).
- A full-attention layer's attn_q gives each head its query then its output gate (head_dim each);
  q and k are RMS-normed per head, then rotated over their first n_rot dims, NeoX's halves, at
  base^(-2i/n_rot); IMROPE gives text tokens the positions [p, p, p, 0], so a pair turns by p unless
  its section is the 4th (or past the 3 sections' interleave): none of Qwen3.5's [11, 11, 10, 0] over
  n_rot 64. Scores scale by 1/sqrt(head_dim), q head h reads kv head h // (n_head / n_head_kv), and the
  heads' output is multiplied by sigmoid(gate) before attn_output.
- A DeltaNet layer projects q, k, v at once (attn_qkv), z (attn_gate), beta = sigmoid(ssm_beta x) and
  g = softplus(ssm_alpha x + dt_bias) * ssm_a (ssm_a = -exp(A_log)), a scalar a v head. The q, k, v
  channels go through a causal conv (tap d_conv - 1 on the current row, tap 0 on the row d_conv - 1
  back, zeros before the first) and SiLU; q and k are L2-normed per head (rms_norm(x, eps / n) /
  sqrt(n) = x / sqrt(sum(x^2) + eps)). v head h reads k head h % H_k (ggml's kernel: iq1 = iv1 % neq1;
  ggml_repeat_4d tiles the k heads likewise). The state S [S_k, S_v] of a v head, zero at first:
  S *= exp(g); d = (v - S^T k) * beta; S += k d^T; o = S^T q / sqrt(S_k). Then RMSNorm of o per head
  (ssm_norm) times silu(z), and ssm_out.
- Each layer: x += mixer(attn_norm(x)); x += ffn(post_attention_norm(x)), a SwiGLU. Then
  output_norm and output.weight (token_embd.weight when it is absent).

`Variant` switches one feature off or gets one wrong, for the tests' negative controls.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize

from exact import attend  # tests/ is on the path: the float64 attention both exact passes share

F64 = np.float64


@dataclass(frozen=True)
class Variant:
    """The exact pass by default; each field set otherwise breaks one feature."""
    decay: bool = True  # False: exp(g) = 1, the state never fades
    beta: bool = True  # False: beta = 1, the full delta-rule step
    conv: bool = True  # False: the conv's taps the identity (the current row alone)
    z_gate: bool = True  # False: DeltaNet's output not multiplied by silu(z)
    attn_gate: bool = True  # False: attention's output not multiplied by sigmoid(gate)
    rope_dims: int | None = None  # rotate this many dims of a head instead of the file's n_rot
    interleaved_heads: bool = False  # True: v head h reads k head h // (H_v / H_k), HF's repeat_interleave


EXACT = Variant()


@dataclass(frozen=True)
class Hparams:
    n_layer: int
    n_head: int
    n_head_kv: int
    head_dim: int
    eps: float
    rope_base: float
    n_rot: int
    sections: tuple[int, ...]
    d_conv: int
    d_state: int  # S_k = S_v
    n_k_heads: int  # H_k, llama.cpp's ssm group count
    n_v_heads: int  # H_v, its time-step rank
    recurrent: tuple[bool, ...]


def _meta(reader: GGUFReader, key: str, default=None):
    field = reader.fields.get(key)
    if field is None:
        if default is None:
            raise KeyError(key)
        return default
    return field.contents()


def read_hparams(reader: GGUFReader) -> Hparams:
    a = "qwen35"
    if _meta(reader, "general.architecture") != a:
        raise ValueError("not a qwen35 GGUF")
    if _meta(reader, f"{a}.rope.scaling.factor", 1.0) not in (0.0, 1.0):
        raise ValueError("RoPE scaling is not in this reference")
    n_layer, n_embd = int(_meta(reader, f"{a}.block_count")), int(_meta(reader, f"{a}.embedding_length"))
    n_head = int(_meta(reader, f"{a}.attention.head_count"))
    head_dim = int(_meta(reader, f"{a}.attention.key_length", n_embd // n_head))
    interval = int(_meta(reader, f"{a}.full_attention_interval", 4))
    recurrent = _meta(reader, f"{a}.attention.recurrent_layers", [(il + 1) % interval != 0 for il in range(n_layer)])
    d_state, n_v_heads = int(_meta(reader, f"{a}.ssm.state_size")), int(_meta(reader, f"{a}.ssm.time_step_rank"))
    assert int(_meta(reader, f"{a}.ssm.inner_size")) == n_v_heads * d_state  # llama.cpp's state is [S, S, H_v]
    return Hparams(
        n_layer=n_layer, n_head=n_head, n_head_kv=int(_meta(reader, f"{a}.attention.head_count_kv", n_head)),
        head_dim=head_dim, eps=float(_meta(reader, f"{a}.attention.layer_norm_rms_epsilon")),
        rope_base=float(_meta(reader, f"{a}.rope.freq_base", 10000.0)),
        n_rot=int(_meta(reader, f"{a}.rope.dimension_count", head_dim)),
        sections=tuple(int(v) for v in _meta(reader, f"{a}.rope.dimension_sections", [0, 0, 0, 0])),
        d_conv=int(_meta(reader, f"{a}.ssm.conv_kernel")), d_state=d_state,
        n_k_heads=int(_meta(reader, f"{a}.ssm.group_count")), n_v_heads=n_v_heads,
        recurrent=tuple(bool(r) for r in recurrent[:n_layer]))


def _weights(reader: GGUFReader) -> dict[str, np.ndarray]:
    """Every tensor's exact values in float64, numpy order (ggml's ne reversed)."""
    out = {}
    for t in reader.tensors:
        shape = tuple(reversed([int(n) for n in t.shape]))
        out[t.name] = dequantize(t.data, t.tensor_type).astype(F64).reshape(shape)
    return out


def _rms(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def _l2(x: np.ndarray, eps: float) -> np.ndarray:
    """build_gdn_l2_norm: rms_norm(x, eps / n) / sqrt(n)."""
    return x / np.sqrt((x * x).sum(-1, keepdims=True) + eps)


def _silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def _softplus(x: np.ndarray) -> np.ndarray:
    return np.where(x > 20.0, x, np.log1p(np.exp(np.minimum(x, 20.0))))  # ggml's, linear past 20


def imrope_turns(sections: tuple[int, ...], n_pairs: int) -> np.ndarray:
    """[n_pairs] bools: which rotated pairs turn by a text token's position p (IMROPE's t, h and w
    sections, all given p) rather than by 0 (its 4th section, e). ggml's ggml_mrope_cache_init: pair i's
    sector is i % sum(sections); sector % 3 == 0, 1, 2 is t, h, w while under 3 * that section's size."""
    total = sum(sections)
    if total == 0:  # no sections: a plain NeoX rope
        return np.ones(n_pairs, bool)
    sector = np.arange(n_pairs) % total
    return np.array([any(s % 3 == j and s < 3 * sections[j] for j in range(3)) for s in sector])


def _rope(x: np.ndarray, pos: np.ndarray, hp: Hparams, n_rot: int) -> np.ndarray:
    """x [n, heads, head_dim]: NeoX pairs (i, i + n_rot / 2) of the first n_rot dims turned by
    pos * base^(-2i / n_rot), or by 0 where IMROPE gives the pair the 4th position; the rest as they are."""
    if n_rot == 0:
        return x
    half = n_rot // 2
    i = np.arange(half, dtype=F64)
    p = np.where(imrope_turns(hp.sections, half)[None, :], pos[:, None].astype(F64), 0.0)
    theta = p * hp.rope_base ** (-2.0 * i / n_rot)  # [n, half]
    cos, sin = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
    a, b = x[..., :half], x[..., half:n_rot]
    out = x.copy()
    out[..., :half], out[..., half:n_rot] = a * cos - b * sin, a * sin + b * cos
    return out


def _attention(h: np.ndarray, w: dict[str, np.ndarray], hp: Hparams, v: Variant) -> np.ndarray:
    n, hd = len(h), hp.head_dim
    qg = (h @ w["attn_q.weight"].T).reshape(n, hp.n_head, 2 * hd)  # per head: query, then gate
    q, gate = qg[..., :hd], qg[..., hd:]
    q = _rms(q, w["attn_q_norm.weight"], hp.eps)
    k = _rms((h @ w["attn_k.weight"].T).reshape(n, hp.n_head_kv, hd), w["attn_k_norm.weight"], hp.eps)
    val = (h @ w["attn_v.weight"].T).reshape(n, hp.n_head_kv, hd)
    pos = np.arange(n)
    n_rot = hp.n_rot if v.rope_dims is None else v.rope_dims
    q, k = _rope(q, pos, hp, n_rot), _rope(k, pos, hp, n_rot)
    out = attend(q, k, val, pos[None, :] <= pos[:, None])
    if v.attn_gate:
        out = out * _sigmoid(gate)
    return out.reshape(n, -1) @ w["attn_output.weight"].T


def _deltanet(h: np.ndarray, w: dict[str, np.ndarray], hp: Hparams, v: Variant) -> np.ndarray:
    n, S, H_k, H_v = len(h), hp.d_state, hp.n_k_heads, hp.n_v_heads
    key = H_k * S
    mixed = h @ w["attn_qkv.weight"].T  # [n, conv channels]: q, k, v
    z = (h @ w["attn_gate.weight"].T).reshape(n, H_v, S)
    beta = _sigmoid(h @ w["ssm_beta.weight"].T) if v.beta else np.ones((n, H_v))
    g = _softplus(h @ w["ssm_alpha.weight"].T + w["ssm_dt.bias"]) * w["ssm_a"]  # [n, H_v], <= 0
    decay = np.exp(g) if v.decay else np.ones((n, H_v))
    taps = w["ssm_conv1d.weight"]  # [channels, d_conv]: tap d_conv - 1 on the current row
    if not v.conv:
        taps = np.zeros_like(taps)
        taps[:, -1] = 1.0
    pairs = [hh // (H_v // H_k) if v.interleaved_heads else hh % H_k for hh in range(H_v)]

    window = np.zeros((hp.d_conv, mixed.shape[1]))  # the d_conv - 1 previous rows (zero at first), then this one
    state = np.zeros((H_v, S, S))  # a v head's S [S_k, S_v]
    out = np.empty((n, H_v, S))
    for t in range(n):
        window = np.vstack([window[1:], mixed[t]])
        c = _silu((window * taps.T).sum(0))
        q = _l2(c[:key].reshape(H_k, S), hp.eps)
        k = _l2(c[key:2 * key].reshape(H_k, S), hp.eps)
        val = c[2 * key:].reshape(H_v, S)
        for hh in range(H_v):
            kk, qq, st = k[pairs[hh]], q[pairs[hh]], state[hh]
            st *= decay[t, hh]
            d = (val[hh] - st.T @ kk) * beta[t, hh]
            st += np.outer(kk, d)
            out[t, hh] = st.T @ qq / np.sqrt(F64(S))
    o = _rms(out, w["ssm_norm.weight"], hp.eps)
    if v.z_gate:
        o = o * _silu(z)
    return o.reshape(n, -1) @ w["ssm_out.weight"].T


def _ffn(h: np.ndarray, w: dict[str, np.ndarray]) -> np.ndarray:
    return (_silu(h @ w["ffn_gate.weight"].T) * (h @ w["ffn_up.weight"].T)) @ w["ffn_down.weight"].T


def forward(path: str | Path, tokens: list[int], variant: Variant = EXACT) -> np.ndarray:
    """[len(tokens), n_vocab] float64: each position's next-token logits, the tokens a sequence from
    position 0 (fresh states). Layer by layer over the whole sequence: the projections are per row, and
    the conv, the delta rule and causal attention go token by token."""
    reader = GGUFReader(str(path))
    hp = read_hparams(reader)
    wt = _weights(reader)
    x = wt["token_embd.weight"][np.asarray(tokens)]
    for il in range(hp.n_layer):
        w = {name.split(".", 2)[2]: a for name, a in wt.items() if name.startswith(f"blk.{il}.")}
        mixer = _deltanet if hp.recurrent[il] else _attention
        x = x + mixer(_rms(x, w["attn_norm.weight"], hp.eps), w, hp, variant)
        x = x + _ffn(_rms(x, w["post_attention_norm.weight"], hp.eps), w)
    head = wt.get("output.weight", wt["token_embd.weight"])
    return _rms(x, wt["output_norm.weight"], hp.eps) @ head.T
