"""Scalar reference kernels against gguf's own numpy (de)quantization and numpy math."""
from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import GGML_QUANT_SIZES, quants

from compiler.build.runtime import runtime_kernels

from compiler.core.dtypes import RUNTIME_DTYPES, X8_DTYPES, act_row_bytes
from encoder_reference import alibi_slopes

K = runtime_kernels()
ffi, lib = K.ffi, K.lib
BLOCK_TYPES = [d.value for d in RUNTIME_DTYPES]  # the one table of types (compiler/core/dtypes.py)
K_TYPES = (Q.Q4_K, Q.Q5_K, Q.Q6_K)
Q8_K_TYPES = tuple(d.value for d in RUNTIME_DTYPES if act_row_bytes(d, 256) == 292)  # dotted against q8_K
# byte offsets of the f16 scales in each K-quant block (d, dmin) or (d,)
K_SCALE_AT = {Q.Q4_K: (0, 2), Q.Q5_K: (0, 2), Q.Q6_K: (208,)}


def ptr(a: np.ndarray, ctype: str = "void *"):
    return ffi.cast(ctype, ffi.from_buffer(a))


def random_k_blocks(rng, rows: int, n: int, t: Q) -> np.ndarray:
    """Random K-quant rows (gguf has no K-quantizer): random bits, finite f16 scales."""
    block_bytes = GGML_QUANT_SIZES[t][1]
    raw = rng.integers(0, 256, (rows, n // 256, block_bytes), dtype=np.uint8)
    for at in K_SCALE_AT[t]:
        raw[:, :, at:at + 2] = (rng.uniform(0.001, 0.05, (rows, n // 256, 1)).astype(np.float16)
                                .view(np.uint8).reshape(rows, n // 256, 2))
    return raw.reshape(rows, -1)


def sane(raw: np.ndarray, t: Q, limit: float = 1e6) -> np.ndarray:
    """Which blocks (rows of raw) gguf dequantizes to finite weights no larger than limit."""
    with np.errstate(all="ignore"):
        w = quants.dequantize(raw, t).reshape(len(raw), -1)
    return np.isfinite(w).all(axis=1) & (np.abs(w).max(axis=1) <= limit)


def random_blocks(rng, rows: int, n: int, t: Q) -> np.ndarray:
    """Random bytes for the types gguf cannot quantize, drawn again wherever a random f16 scale made
    a block non-finite or huge: every index, sign and scale bit pattern, without knowing where the
    type keeps them."""
    block, size = GGML_QUANT_SIZES[t]
    raw = rng.integers(0, 256, (rows * n // block, size), dtype=np.uint8)
    while not (ok := sane(raw, t)).all():
        raw[~ok] = rng.integers(0, 256, (int((~ok).sum()), size), dtype=np.uint8)
    return raw.reshape(rows, -1)


def extreme_blocks(rng, t: Q, count: int = 8) -> np.ndarray:
    """Blocks pushed to their extremes: from a random block, every byte in a random order is set to
    0xFF (or 0x00) wherever the block stays finite, so the largest indexes, scales and signs meet."""
    block, size = GGML_QUANT_SIZES[t]
    out = random_blocks(rng, count, block, t).reshape(count, size)
    for i in range(count):
        for at in rng.permutation(size):
            trial = out[i:i + 1].copy()
            trial[0, at] = 0xFF if i % 2 == 0 else 0x00
            if sane(trial, t)[0]:
                out[i] = trial[0]
    return out


def quantized(rng, rows: int, n: int, t: Q) -> tuple[np.ndarray, np.ndarray]:
    if t in K_TYPES:
        raw = random_k_blocks(rng, rows, n, t)
        return quants.dequantize(raw, t).reshape(rows, n), raw
    if t in Q8_K_TYPES or t is Q.IQ4_NL:  # gguf-py dequantizes these but has no quantizer
        raw = random_blocks(rng, rows, n, t)
        return quants.dequantize(raw, t).reshape(rows, n), raw
    x = (rng.standard_normal((rows, n)) * rng.uniform(0.01, 3.0, (rows, 1))).astype(np.float32)
    raw = x if t is Q.F32 else quants.quantize(x, t)
    return x, np.ascontiguousarray(raw).view(np.uint8).reshape(rows, -1)


def act_values(t: Q, act: np.ndarray, n: int) -> np.ndarray:
    """Decode the activation row a dot product sees, independently of the C code."""
    if t in (Q.F32, Q.F16, Q.BF16):
        return act.view(np.float32)
    if t in Q8_K_TYPES:  # q8_K: f32 d, 256 x int8, 16 x int16 sums
        blocks = act.reshape(-1, 292)
        d = blocks[:, :4].copy().view(np.float32)
        return (d * blocks[:, 4:260].view(np.int8)).reshape(n)
    if t in (Q.Q4_1, Q.Q5_1):  # q8_1: f16 d, f16 s, 32 x int8
        blocks = act.reshape(-1, 36)
        d = blocks[:, :2].copy().view(np.float16).astype(np.float32)
        return (d * blocks[:, 4:].view(np.int8)).reshape(n)
    return quants.dequantize(act.reshape(-1, 34), Q.Q8_0).reshape(n)


@pytest.mark.parametrize("t", BLOCK_TYPES, ids=lambda t: t.name)
def test_dequantize_matches_gguf(t):
    rng = np.random.default_rng(int(t))
    _, raw = quantized(rng, 8, 256, t)
    want = quants.dequantize(raw, t).reshape(8, 256) if t is not Q.F32 else raw.view(np.float32)
    got = np.zeros((8, 256), np.float32)
    for r in range(8):
        lib.kiln_dequantize_row(int(t), ptr(raw[r]), ptr(got[r], "float *"), 256)
    assert np.array_equal(got, want)
    assert lib.kiln_row_bytes(int(t), 256) == raw.shape[1]


def test_q8_0_activation_quantization_matches_gguf():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((16, 256)).astype(np.float32)
    got = np.zeros((16, 8 * 34), np.uint8)
    for r in range(16):
        lib.kiln_quantize_act(int(Q.Q4_0), ptr(x[r]), ptr(got[r]), 256)
    assert np.array_equal(got, quants.quantize(x, Q.Q8_0))


def test_q8_1_sum_term():
    rng = np.random.default_rng(2)
    x = rng.standard_normal(64).astype(np.float32)
    act = np.zeros(2 * 36, np.uint8)
    lib.kiln_quantize_act(int(Q.Q4_1), ptr(x), ptr(act), 64)
    blocks = act.reshape(2, 36)
    d = blocks[:, 0:2].copy().view(np.float16).astype(np.float32).ravel()
    s = blocks[:, 2:4].copy().view(np.float16).astype(np.float32).ravel()
    qsum = blocks[:, 4:].view(np.int8).astype(np.int32).sum(axis=1)
    np.testing.assert_allclose(s, (d * qsum).astype(np.float16).astype(np.float32))


def min_term_rounding(t: Q, w: np.ndarray, act: np.ndarray) -> float:
    """q4_1/q5_1 dots use the f16-rounded s = d*sum(q) for the minimum's term, like ggml: its offset."""
    if t not in (Q.Q4_1, Q.Q5_1):
        return 0.0
    m = w.reshape(-1, 20 if t is Q.Q4_1 else 24)[:, 2:4].copy().view(np.float16).astype(np.float64).ravel()
    blocks = act.reshape(-1, 36)
    d = blocks[:, 0:2].copy().view(np.float16).astype(np.float64).ravel()
    s = blocks[:, 2:4].copy().view(np.float16).astype(np.float64).ravel()
    exact = d * blocks[:, 4:].view(np.int8).astype(np.float64).sum(axis=1)
    return float(m @ (s - exact))


@pytest.mark.parametrize("t", BLOCK_TYPES, ids=lambda t: t.name)
def test_vec_dot_against_dequantized_numpy(t):
    rng = np.random.default_rng(100 + int(t))
    n = 512
    _, w = quantized(rng, 4, n, t)
    wf = quants.dequantize(w, t).reshape(4, n) if t is not Q.F32 else w.view(np.float32)
    x = rng.standard_normal(n).astype(np.float32)
    act = np.zeros(lib.kiln_act_row_bytes(int(t), n), np.uint8)
    lib.kiln_quantize_act(int(t), ptr(x), ptr(act), n)
    a = act_values(t, act, n).astype(np.float64)
    for r in range(4):
        got = lib.kiln_vec_dot(int(t), n, ptr(w[r]), ptr(act))
        want = float(wf[r].astype(np.float64) @ a) + min_term_rounding(t, w[r], act)
        assert got == pytest.approx(want, rel=1e-5, abs=1e-4)


@pytest.mark.parametrize("t", [t for t in BLOCK_TYPES if t not in (Q.F32, Q.F16, Q.BF16)], ids=lambda t: t.name)
def test_extreme_blocks_dequantize_and_dot_as_gguf_and_the_reference(t):
    """Blocks at their extremes (largest indexes and scales, all signs, or all zero bits) dequantize
    to gguf's values; the dispatched dot equals the reference's bits and the reference the float64
    dot of gguf's weights (to the rounding of the float steps)."""
    rng = np.random.default_rng(500 + int(t))
    block = GGML_QUANT_SIZES[t][0]
    n = max(block, 256)
    raw = extreme_blocks(rng, t, 16 * n // block).reshape(16, -1)
    got = np.zeros((16, n), np.float32)
    for r in range(16):
        lib.kiln_dequantize_row(int(t), ptr(raw[r]), ptr(got[r], "float *"), n)
    wf = quants.dequantize(raw, t).reshape(16, n)
    np.testing.assert_array_equal(got, wf)
    x = rng.standard_normal(n).astype(np.float32) * 7
    act = np.zeros(lib.kiln_act_row_bytes(int(t), n), np.uint8)
    lib.kiln_quantize_act(int(t), ptr(x), ptr(act), n)
    a = act_values(t, act, n).astype(np.float64)
    for r in range(16):
        fast, ref = lib.kiln_vec_dot(int(t), n, ptr(raw[r]), ptr(act)), lib.kiln_vec_dot_ref(int(t), n, ptr(raw[r]), ptr(act))
        assert np.float32(fast).tobytes() == np.float32(ref).tobytes(), f"row {r}: {fast!r} != {ref!r}"
        exact = float(wf[r].astype(np.float64) @ a) + min_term_rounding(t, raw[r], act)
        assert ref == pytest.approx(exact, rel=1e-5, abs=1e-6 * float(np.abs(wf[r]).astype(np.float64) @ np.abs(a)))


def test_q8_K_block_sums():
    rng = np.random.default_rng(8)
    x = rng.standard_normal(512).astype(np.float32)
    act = np.zeros(2 * 292, np.uint8)
    lib.kiln_quantize_act(int(Q.Q6_K), ptr(x), ptr(act), 512)
    blocks = act.reshape(2, 292)
    q = blocks[:, 4:260].view(np.int8).astype(np.int32)
    assert np.array_equal(blocks[:, 260:].view(np.int16), q.reshape(2, 16, 16).sum(axis=2))
    d = blocks[:, :4].copy().view(np.float32).ravel()
    np.testing.assert_allclose((d[:, None] * q).ravel(), x, atol=np.abs(x).max() / 127)


@pytest.mark.parametrize("t", [Q.Q8_0, Q.Q4_1, Q.F16, Q.Q4_K, Q.Q6_K], ids=lambda t: t.name)
def test_matmul_with_bias(t):
    rng = np.random.default_rng(7)
    n_in, n_out, rows = 256, 48, 5
    wf, w = quantized(rng, n_out, n_in, t)
    wf = quants.dequantize(w, t).reshape(n_out, n_in)
    x = rng.standard_normal((rows, n_in)).astype(np.float32)
    bias = rng.standard_normal(n_out).astype(np.float32)
    y = matmul(t, w, x, bias)
    want = x.astype(np.float64) @ wf.T.astype(np.float64) + bias
    # 8-bit activations: error ~ |w|.|x| / 127 per output
    np.testing.assert_allclose(y, want, atol=0.03 * np.abs(wf).sum(axis=1).max() * np.abs(x).max() / 127 * 4)


def test_rms_norm():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((3, 96)).astype(np.float32) * 5
    w = rng.standard_normal(96).astype(np.float32)
    y = np.zeros_like(x)
    lib.kiln_rms_norm(ptr(y, "float *"), ptr(x, "float *"), ptr(w, "float *"), 1.0, 1e-6, 96, 3)
    xd = x.astype(np.float64)
    want = xd / np.sqrt((xd ** 2).mean(axis=1, keepdims=True) + 1e-6) * (w + 1.0)
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("neox", [0, 1])
def test_rope(neox):
    rng = np.random.default_rng(4)
    rows, heads, d, base = 3, 2, 16, 10000.0
    x = rng.standard_normal((rows, heads, d)).astype(np.float32)
    pos = np.array([0, 7, 1500], np.int32)
    y = np.zeros_like(x)
    lib.kiln_rope(ptr(y, "float *"), ptr(x, "float *"), ptr(pos, "int32_t *"), rows, heads, d, base, neox)
    i = np.arange(d // 2)
    theta = pos[:, None].astype(np.float64) * base ** (-2.0 * i / d)  # [rows, d/2]
    c, s = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
    i0, i1 = (i, i + d // 2) if neox else (2 * i, 2 * i + 1)
    want = x.astype(np.float64).copy()
    want[..., i0] = x[..., i0] * c - x[..., i1] * s
    want[..., i1] = x[..., i0] * s + x[..., i1] * c
    np.testing.assert_allclose(y, want, atol=2e-3)  # float theta at position 1500 carries ~1e-4 rad
    np.testing.assert_allclose(y[:2], want[:2], atol=1e-5)


def _ggml_rope(x, pos, base, neox, freq_scale=1.0, ext_factor=0.0, mscale=1.0, beta_fast=32.0, beta_slow=1.0,
               n_ctx_orig=0, factors=None, n_rot=None):
    """ggml's CPU rope (ggml_rope_cache_init, rope_yarn, ggml_rope_yarn_corr_dims), step by step in
    float32: an independent spelling of what kiln_rope_ext must compute. n_rot: ggml's n_dims, the
    dims that rotate (the rest pass through)."""
    f = np.float32
    rows, heads, d = x.shape
    d = n_rot or d
    theta_scale = f(base) ** f(-2.0 / d)
    lo = hi = 0.0
    if ext_factor:  # the correction dimensions: where a dimension's wavelength fits beta turns in the context
        corr = lambda beta: d * np.log(n_ctx_orig / (beta * 2 * np.pi)) / (2 * np.log(base))  # noqa: E731
        lo, hi = max(0.0, np.floor(corr(beta_fast))), min(d - 1.0, np.ceil(corr(beta_slow)))
    y = x.astype(np.float64).copy()
    for r in range(rows):
        theta = f(pos[r])
        for i in range(d // 2):
            extrap = theta / f(factors[i]) if factors is not None else theta
            angle = f(freq_scale) * extrap
            if ext_factor:
                mix = f(1 - min(1.0, max(0.0, (i - lo) / max(0.001, hi - lo)))) * f(ext_factor)
                angle = angle * (f(1) - mix) + extrap * mix
            c, s_ = np.cos(np.float64(angle)) * mscale, np.sin(np.float64(angle)) * mscale
            i0, i1 = (i, i + d // 2) if neox else (2 * i, 2 * i + 1)
            x0, x1 = x[r, :, i0].astype(np.float64), x[r, :, i1].astype(np.float64)
            y[r, :, i0], y[r, :, i1] = x0 * c - x1 * s_, x0 * s_ + x1 * c
            theta = f(theta * theta_scale)
    return y


@pytest.mark.parametrize("case", ["plain", "factors", "linear", "yarn", "yarn-betas", "attn-factor", "partial"])
def test_rope_ext_follows_ggml(case):
    """Llama 3's factors, linear and YaRN scaling (defaults and other betas), an attention factor, a
    partial rope (Qwen3.5's first quarter of each head): kiln_rope_ext against ggml's formulas;
    unscaled it is kiln_rope, bit for bit."""
    rng = np.random.default_rng(41)
    rows, heads, d, base = 4, 2, 32, 10000.0
    x = rng.standard_normal((rows, heads, d)).astype(np.float32)
    pos = np.array([0, 5, 63, 200], np.int32)  # an angle near 200 rad holds it to 1.5e-5 (its float ulp)
    sc = {"plain": {}, "factors": {}, "linear": dict(freq_scale=0.25), "attn-factor": dict(mscale=1.19),
          "yarn": dict(freq_scale=0.25, ext_factor=1.0, mscale=1.1386, n_ctx_orig=32),
          "yarn-betas": dict(freq_scale=0.125, ext_factor=1.0, mscale=1.2, beta_fast=16.0, beta_slow=2.0,
                             n_ctx_orig=64), "partial": {}}[case]
    n_rot = d // 4 if case == "partial" else d
    factors = rng.uniform(1.0, 8.0, d // 2).astype(np.float32) if case == "factors" else None
    c = ffi.new("kiln_rope_scaling *", {"freq_scale": 1.0, "ext_factor": 0.0, "mscale": 1.0, "beta_fast": 32.0,
                                        "beta_slow": 1.0, "n_ctx_orig": 0, **sc})
    for neox in (0, 1):
        y = np.zeros_like(x)
        lib.kiln_rope_ext(ptr(y, "float *"), ptr(x, "float *"), ptr(pos, "int32_t *"), rows, heads, d, n_rot, base,
                          neox, c, ptr(factors, "float *") if factors is not None else ffi.NULL)
        want = _ggml_rope(x, pos, base, neox, factors=factors, n_rot=n_rot, **sc)
        np.testing.assert_allclose(y, want, atol=6e-5)
        if case == "plain":
            plain = np.zeros_like(x)
            lib.kiln_rope(ptr(plain, "float *"), ptr(x, "float *"), ptr(pos, "int32_t *"), rows, heads, d, base, neox)
            np.testing.assert_array_equal(y, plain)


def test_softcap_is_tanh_on_every_path():
    """kiln_softcap(x, c) = c tanh(x / c) with one tanh (vec_f32.h): within 3e-7 of numpy's, and the
    same bits whether an element falls in a vector or in the scalar tail."""
    rng = np.random.default_rng(42)
    x = np.concatenate([rng.standard_normal(300) * 3, [0.0, -0.0, 0.6249999, 0.625, -0.625, 1e-8, 9.0, 50.0, -88.0,
                                                       1e4, -1e30]]).astype(np.float32)
    y = np.zeros_like(x)
    lib.kiln_softcap(ptr(y, "float *"), ptr(x, "float *"), len(x), 1.0)
    np.testing.assert_allclose(y, np.tanh(x.astype(np.float64)), rtol=3e-7, atol=1e-30)
    assert y[-1] == -1.0 and y[-2] == 1.0
    for start in (1, 3, 7):
        part = np.zeros(len(x) - start, np.float32)
        lib.kiln_softcap(ptr(part, "float *"), ptr(x[start:], "float *"), len(part), 1.0)
        np.testing.assert_array_equal(part, y[start:])
    capped = np.zeros_like(x)
    lib.kiln_softcap(ptr(capped, "float *"), ptr(x, "float *"), len(x), 30.0)
    inv = np.float32(1) / np.float32(30)
    np.testing.assert_allclose(capped, 30 * np.tanh((x * inv).astype(np.float64)), rtol=5e-7, atol=1e-6)
    lib.kiln_scale(ptr(y, "float *"), ptr(x, "float *"), len(x), np.float32(0.22))
    np.testing.assert_array_equal(y, x * np.float32(0.22))


def test_glu_and_add():
    rng = np.random.default_rng(5)
    g, u = rng.standard_normal((2, 300)).astype(np.float32) * 3
    y = np.zeros(300, np.float32)
    lib.kiln_swiglu(ptr(y, "float *"), ptr(g, "float *"), ptr(u, "float *"), 300)
    np.testing.assert_allclose(y, g / (1 + np.exp(-g.astype(np.float64))) * u, rtol=1e-5, atol=1e-6)
    ref = np.zeros(300, np.float32)
    lib.kiln_swiglu_ref(ptr(ref, "float *"), ptr(g, "float *"), ptr(u, "float *"), 300)
    np.testing.assert_allclose(y, ref, rtol=1e-6, atol=1e-7)
    part = np.zeros(297, np.float32)  # a share that starts elsewhere and ends mid-vector: the same bits
    lib.kiln_swiglu(ptr(part, "float *"), ptr(g[3:], "float *"), ptr(u[3:], "float *"), 297)
    np.testing.assert_array_equal(part, y[3:])
    lib.kiln_geglu(ptr(y, "float *"), ptr(g, "float *"), ptr(u, "float *"), 300)
    gd = g.astype(np.float16).astype(np.float64)  # llama.cpp evaluates GELU at f16 and rounds it to f16
    gelu = (0.5 * gd * (1 + np.tanh(np.sqrt(2 / np.pi) * (gd + 0.044715 * gd ** 3)))).astype(np.float16)
    np.testing.assert_allclose(y, gelu.astype(np.float64) * u, rtol=2e-3, atol=1e-6)
    lib.kiln_add(ptr(y, "float *"), ptr(g, "float *"), ptr(u, "float *"), 300)
    np.testing.assert_array_equal(y, g + u)


def test_erf_gelu_and_its_glu():
    """BERT's GELU, x Phi(x) by erf, and jina-bert-v2's GLU of it, against math.erf in float64, to
    2e-6 relative down to 1e-12 (the two forms meet at -1/sqrt 2)."""
    import math
    x = np.concatenate([np.linspace(-12, 12, 4001), [-0.7071068, -0.70710677, 0.0, -30.0, 30.0]]).astype(np.float32)
    u = np.linspace(-2, 3, x.size).astype(np.float32)
    exact = np.array([0.5 * v * (1 + math.erf(v / math.sqrt(2))) for v in x.astype(np.float64)])
    y, glu = np.zeros_like(x), np.zeros_like(x)
    lib.kiln_gelu(ptr(y, "float *"), ptr(x, "float *"), x.size)
    lib.kiln_geglu_erf(ptr(glu, "float *"), ptr(x, "float *"), ptr(u, "float *"), x.size)
    np.testing.assert_allclose(y, exact, rtol=2e-6, atol=1e-12)
    np.testing.assert_array_equal(glu, y * u)  # one rounding after the GELU's


@pytest.mark.parametrize("t", [Q.Q8_0, Q.Q4_1, Q.F32], ids=lambda t: t.name)
def test_embed_rows(t):
    rng = np.random.default_rng(6)
    _, table = quantized(rng, 50, 64, t)
    tf = quants.dequantize(table, t).reshape(50, 64) if t is not Q.F32 else table.view(np.float32)
    ids = np.array([3, 49, 0, 3], np.int32)
    y = np.zeros((4, 64), np.float32)
    lib.kiln_embed(int(t), ptr(y, "float *"), ptr(table), ptr(ids, "int32_t *"), 4, 64, 2.0)
    np.testing.assert_array_equal(y, tf[ids] * 2.0)


def test_python_and_c_agree_on_supported_types():
    from compiler.core.dtypes import RUNTIME_DTYPES, WEIGHT_DTYPES
    assert {d for d in WEIGHT_DTYPES if lib.kiln_type_supported(d.value.value)} == set(RUNTIME_DTYPES)
    assert set(BLOCK_TYPES) == {d.value for d in RUNTIME_DTYPES}


@pytest.mark.parametrize("t", BLOCK_TYPES, ids=lambda t: t.name)
def test_python_and_c_agree_on_activation_formats(t):
    from compiler.core.dtypes import DType, act_row_bytes
    assert lib.kiln_act_row_bytes(int(t), 512) == act_row_bytes(DType(t), 512)
    assert lib.kiln_type_supported(int(t))


class PagedCache:
    """One layer's paged cache for the kernels: K and V [n_kv][page_size][row] in each page,
    pages handed to one sequence in a scrambled order, as a pool that has been in use would.
    `t` is both parts' type, or a (K type, V type) pair."""

    def __init__(self, t, n_kv: int, hd: int, n_pos: int, page_size: int, window: int = 0, seed: int = 0,
                 half_window: int = 0):
        self.types = (t, t) if isinstance(t, Q) else tuple(t)
        self.row_bytes = [lib.kiln_row_bytes(int(x), hd) for x in self.types]
        self.half = [n_kv * page_size * rb for rb in self.row_bytes]
        n_pages = -(-n_pos // page_size)
        rng = np.random.default_rng(seed)
        page_bytes = sum(self.half)
        self.pages = rng.integers(0, 256, (n_pages + 2) * page_bytes, dtype=np.uint8)  # garbage in unused rows
        if self.types != (Q.F32, Q.F32):  # other types must read finite numbers from any row
            self.pages[:] = 0
        self.table = np.ascontiguousarray(rng.permutation(n_pages + 2)[:n_pages].astype(np.int32))
        self.n_kv, self.hd, self.page_size, self.page_bytes = n_kv, hd, page_size, page_bytes
        self.view = ffi.new("kiln_kv_view *", {"pages": ptr(self.pages, "uint8_t *"), "page_bytes": page_bytes,
                                                "k_off": 0, "v_off": self.half[0], "k_type": int(self.types[0]),
                                                "v_type": int(self.types[1]), "tables": ptr(self.table, "int32_t *"),
                                                "max_blocks": n_pages, "page_size": page_size, "window": window,
                                                "half_window": half_window})

    def store(self, k: np.ndarray, v: np.ndarray, rows: np.ndarray) -> None:
        seq = np.zeros(len(rows), np.int32)
        lib.kiln_kv_store(self.view, ptr(k), ptr(v), ptr(seq, "int32_t *"), ptr(rows, "int32_t *"), len(rows),
                          self.n_kv, self.hd)

    def raw(self, part: int, h: int, p: int) -> np.ndarray:
        """The bytes of position p of kv head h, K (0) or V (1), as a row. An f16 or f32 K is held
        transposed in its page, head h's part [hd][page_size] (runtime_c/kv_view.h), so its row is
        gathered."""
        rb, r = self.row_bytes[part], p % self.page_size
        base = self.table[p // self.page_size] * self.page_bytes + part * self.half[0] + h * self.page_size * rb
        if part == 0 and self.types[0] in (Q.F16, Q.F32):
            es = rb // self.hd
            at = base + (np.arange(self.hd)[:, None] * self.page_size + r) * es
            return self.pages[(at + np.arange(es)).reshape(-1)]
        return self.pages[base + r * rb:base + (r + 1) * rb]

    def rows(self, part: int, n_pos: int) -> np.ndarray:
        """[n_kv][n_pos][hd] dequantized (by gguf.quants), read back through the table."""
        t, out = self.types[part], np.zeros((self.n_kv, n_pos, self.hd))
        for p in range(n_pos):
            for h in range(self.n_kv):
                raw = self.raw(part, h, p)
                out[h, p] = raw.view(np.float32) if t is Q.F32 else quants.dequantize(raw[None], t)[0]
        return out

    def attend(self, q: np.ndarray, rows: np.ndarray, n_head: int, scale: float, ref: bool = False,
               max_spans: int = 0, softcap: float = 0.0, sinks: np.ndarray | None = None,
               seen: np.ndarray | None = None, alibi: float = 0.0) -> np.ndarray:
        """Each query at its row; seen: the last row each sees (None: its own, causal)."""
        out = np.zeros((len(rows), n_head, self.hd), np.float32)
        seq = np.zeros(len(rows), np.int32)
        seen = rows if seen is None else seen
        args = (ptr(out, "float *"), ptr(q, "float *"), ptr(seq, "int32_t *"), ptr(rows, "int32_t *"),
                ptr(seen, "int32_t *"), len(rows), self.view, n_head, self.n_kv, self.hd, scale, softcap,
                ffi.NULL if sinks is None else ptr(sinks, "float *"), alibi)
        if ref:
            lib.kiln_attention_ref(*args)
        else:
            scratch = np.full(max(1, n_head * max_spans * (self.hd + 2)), np.nan, np.float32)  # written before read
            lib.kiln_attention(*args, ptr(scratch) if max_spans else ffi.NULL, max_spans)
        return out


KV_TYPES = [Q.F32, Q.F16, Q.Q8_0, Q.Q5_0, Q.Q4_1, Q.Q4_0]  # compiler/dtypes.py KV_DTYPES
KV_PAIRS = [(t, t) for t in KV_TYPES] + [(Q.Q8_0, Q.Q4_0), (Q.F16, Q.Q4_0), (Q.Q4_0, Q.F16)]


def test_kv_types_are_the_compilers():
    from compiler.core.dtypes import KV_DTYPES
    assert [d.value for d in KV_DTYPES.values()] == KV_TYPES


@pytest.mark.parametrize("t", KV_TYPES[1:], ids=lambda t: t.name)
def test_kv_row_quantizer_writes_ggufs_bytes(t):
    """A cache row is quantized to exactly the bytes gguf.quants (ggml's reference rounding)
    writes, including blocks of zeros, ties and a block whose largest value is negative."""
    rng = np.random.default_rng(40 + int(t))
    x = rng.standard_normal((16, 256)).astype(np.float32) * np.float32(3)
    x[0, :32] = 0.0
    x[1, :32] = np.arange(32) - 16  # exact ties under q4_0/q5_0 scales
    x[2, :32] = -np.abs(x[2, :32])
    for row in x:
        got = np.zeros(lib.kiln_row_bytes(int(t), 256), np.uint8)
        lib.kiln_quantize_row(int(t), ptr(row), ptr(got), 256)
        want = row.astype(np.float16).view(np.uint8) if t is Q.F16 else quants.quantize(row[None], t)[0]
        assert got.tobytes() == want.tobytes()


@pytest.mark.parametrize("t", KV_PAIRS, ids=lambda t: f"{t[0].name}-{t[1].name}")
@pytest.mark.parametrize("window,symmetric", [(0, False), (5, False), (0, True), (4, True)],
                         ids=["causal", "causal-window5", "bidirectional", "bidirectional-window4"])
def test_kv_store_and_attention(t, window, symmetric):
    """11 positions into pages of 8 rows, one position at a time as decode writes them; then
    attend from two rows and compare with numpy over the cache as gguf.quants dequantizes it: a
    causal query sees up to itself (within its window); a bidirectional one the whole sequence
    (within p +- window / 2, EmbeddingGemma's symmetric window)."""
    rng = np.random.default_rng(11)
    n_head, n_kv, hd, n_pos = 4, 2, 64, 11
    half = window // 2 if symmetric else 0
    cache = PagedCache(t, n_kv, hd, n_pos, page_size=8, window=0 if symmetric else window, half_window=half)
    k = rng.standard_normal((n_pos, n_kv, hd)).astype(np.float32)
    v = rng.standard_normal((n_pos, n_kv, hd)).astype(np.float32)
    pos = np.arange(n_pos, dtype=np.int32)
    for p in range(n_pos):
        cache.store(k[p], v[p], pos[p:p + 1])
    K, V = cache.rows(0, n_pos), cache.rows(1, n_pos)
    if t[0] is Q.F32:
        assert np.array_equal(K[:, 10], k[10].transpose(0, 1).astype(np.float64))
    q_pos = np.array([3, 10] if symmetric else [9, 10], np.int32)
    q = rng.standard_normal((2, n_head, hd)).astype(np.float32)
    scale = 1 / 8
    seen = np.full(2, n_pos - 1, np.int32) if symmetric else None
    out = cache.attend(q, q_pos, n_head, scale, seen=seen)
    for i, p in enumerate(q_pos):
        if symmetric:
            first, last = (max(0, p - half), min(p + half, n_pos - 1)) if half else (0, n_pos - 1)
        else:
            first, last = max(0, p - window + 1) if window else 0, p
        js = np.arange(first, last + 1)
        for h in range(n_head):
            kv = h // (n_head // n_kv)
            s = K[kv, js] @ q[i, h].astype(np.float64) * scale
            w = np.exp(s - s.max())
            want = (w / w.sum()) @ V[kv, js]
            np.testing.assert_allclose(out[i, h], want, rtol=1e-4, atol=1e-5)


def _with_twin(kind: int) -> list[Q]:
    """The types whose `kind` kernel has a SIMD version in this build: only those have a twin to test."""
    return [t for t in BLOCK_TYPES if lib.kiln_simd_kernels(int(t)) & kind]


def test_the_simd_twins_this_build_has(capsys):
    names = {kind: [t.name for t in _with_twin(getattr(lib, f"KILN_SIMD_{kind}"))]
             for kind in ("DOT", "DEQUANT", "ACT", "STORE")}
    with capsys.disabled():
        print("\nSIMD twins in this build: " + "; ".join(f"{k.lower()}: {', '.join(v) or '-'}" for k, v in names.items()))
    if "Q8_0" in names["DOT"]:  # a SIMD build: every type has its dot's twin
        quantized_types = {t.name for t in BLOCK_TYPES} - {"F32", "F16", "BF16"}
        assert set(names["DOT"]) == {t.name for t in BLOCK_TYPES}
        assert set(names["DEQUANT"]) == {"F16", "Q8_0"} and set(names["ACT"]) == quantized_types


@pytest.mark.parametrize("t", _with_twin(lib.KILN_SIMD_DOT), ids=lambda t: t.name)
def test_simd_dot_matches_its_scalar_twin(t):
    """The dispatched dot (AVX2 where built) against the scalar reference on random blocks: the
    same integer block sums, then the same float steps in the same order, so the same bits."""
    rng = np.random.default_rng(200 + int(t))
    n = 2048
    _, w = quantized(rng, 16, n, t)
    x = rng.standard_normal(n).astype(np.float32)
    act = np.zeros(lib.kiln_act_row_bytes(int(t), n), np.uint8)
    lib.kiln_quantize_act(int(t), ptr(x), ptr(act), n)
    for r in range(16):
        fast, ref = lib.kiln_vec_dot(int(t), n, ptr(w[r]), ptr(act)), lib.kiln_vec_dot_ref(int(t), n, ptr(w[r]), ptr(act))
        assert np.float32(fast).tobytes() == np.float32(ref).tobytes(), f"row {r}: {fast!r} != {ref!r}"


@pytest.mark.parametrize("t", _with_twin(lib.KILN_SIMD_ACT), ids=lambda t: t.name)
def test_simd_activation_quantizer_is_bit_exact(t):
    """The dispatched quantizer (AVX2 where built) writes the scalar reference's exact bytes,
    including half-way values, which roundf takes away from zero and the ISA's rounding would not.
    A row of 34 blocks of 32: the AVX2 quantizers take them 8 at a time, then the last 2 one by one."""
    rng = np.random.default_rng(300 + int(t))
    n = 1024 if GGML_QUANT_SIZES[t][0] == 256 else 34 * 32
    x = rng.standard_normal((8, n)).astype(np.float32)
    x[0, :32] = np.append(127.0, np.arange(-15, 16) + 0.5)  # d = 1 exactly: 31 exact ties
    x[1, :32] = -x[0, :32]
    x[2, :64] = 0.0  # all-zero blocks
    x[3, 40], x[3, 100] = -200.0, 200.0  # the largest magnitude twice: q8_K takes the first one's sign
    for r in range(len(x)):
        fast = np.zeros(lib.kiln_act_row_bytes(int(t), n), np.uint8)
        ref = np.zeros_like(fast)
        lib.kiln_quantize_act(int(t), ptr(x[r]), ptr(fast), n)
        lib.kiln_quantize_act_ref(int(t), ptr(x[r]), ptr(ref), n)
        assert np.array_equal(fast, ref), f"row {r}"


def quantized_rows(t: Q, x: np.ndarray) -> np.ndarray:
    """The activation rows a matmul on type t dots against, quantized one by one."""
    act = np.zeros((len(x), lib.kiln_act_row_bytes(int(t), x.shape[1])), np.uint8)
    for r in range(len(x)):
        lib.kiln_quantize_act(int(t), ptr(x[r]), ptr(act[r]), x.shape[1])
    return act


def matmul(t: Q, w: np.ndarray, x: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
    """kiln_matmul (one thread, the GGUF rows) of x's rows against w's rows, plus bias."""
    (rows, n_in), n_out = x.shape, len(w)
    y = np.zeros((rows, n_out), np.float32)
    scratch = np.zeros(lib.kiln_matmul_scratch_bytes(int(t), rows, n_in), np.uint8)
    lib.kiln_matmul(int(t), ptr(w), ffi.NULL if bias is None else ptr(bias, "float *"), n_out, n_in,
                    ptr(x, "float *"), rows, ptr(y, "float *"), ptr(scratch))
    return y


def reference_dots(t: Q, w: np.ndarray, act: np.ndarray, n_in: int) -> np.ndarray:
    """The scalar reference dot of every (activation row, weight row) pair."""
    return np.array([[lib.kiln_vec_dot_ref(int(t), n_in, ptr(wo), ptr(a)) for wo in w] for a in act], np.float32)


@pytest.mark.parametrize("t", [Q.F32, Q.F16, Q.BF16], ids=lambda t: t.name)
@pytest.mark.parametrize("n_in", [7, 8, 24, 29, 48, 61, 384])
def test_float_matmul_tiles_match_reference_dots_at_every_length(t, n_in):
    """The float types' tiles (4 weight rows x 4 activation rows with AVX-512, then single weight
    rows) against the reference dot at lengths that leave each tail of its order: 16-lane
    steps, an 8-lane step, single products."""
    rng = np.random.default_rng(500 + int(t) + n_in)
    n_out, rows = 15, 11  # 4 + 4 + 4 + 3 weight rows; 4 + 4 + 3 activation rows
    w = rng.standard_normal((n_out, n_in)).astype(np.float32)
    w = np.ascontiguousarray(w if t is Q.F32 else quants.quantize(w, t)).view(np.uint8).reshape(n_out, -1)
    x = rng.standard_normal((rows, n_in)).astype(np.float32)
    np.testing.assert_array_equal(matmul(t, w, x), reference_dots(t, w, x, n_in))


@pytest.mark.parametrize("t", [Q.F16, Q.Q8_0, Q.Q4_K], ids=lambda t: t.name)
def test_a_bias_is_added_to_every_row_once(t):
    """A matmul with a bias takes its activation rows in blocks (matmul.c, BIAS_ROWS): each output
    is its reference dot plus the bias, one rounding, on rows past the first blocks too."""
    rng = np.random.default_rng(600 + int(t))
    n_in, n_out, rows = 256, 24, 150
    _, w = quantized(rng, n_out, n_in, t)
    x = rng.standard_normal((rows, n_in)).astype(np.float32)
    bias = rng.standard_normal(n_out).astype(np.float32)
    y = matmul(t, w, x, bias)
    np.testing.assert_array_equal(y, reference_dots(t, w, quantized_rows(t, x), n_in) + bias)


@pytest.mark.parametrize("t", BLOCK_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("n_out,rows", [(1, 1), (7, 1), (13, 2), (12, 3), (21, 6), (37, 7), (37, 9), (29, 10),
                                        (40, 19)])
def test_matmul_tiles_match_reference_dots(t, n_out, rows):
    """The matmul (tiles of 8 or 16 weight rows, passes of up to 8 activation rows, where built)
    against the scalar reference dot of every (row, output) pair, on shapes that leave partial
    tiles on both sides and every remainder of a pass (6 = 4 + 2, 7 = 4 + 2 + 1, 10 = 8 + 2,
    19 = 8 + 8 + 2 + 1); 1 and 2 rows are decode's passes (the super-block types' rows_decode)."""
    rng = np.random.default_rng(400 + int(t) + n_out)
    n_in = 512
    _, w = quantized(rng, n_out, n_in, t)
    x = rng.standard_normal((rows, n_in)).astype(np.float32)
    np.testing.assert_array_equal(matmul(t, w, x), reference_dots(t, w, quantized_rows(t, x), n_in))


@pytest.mark.parametrize("t", [Q.F32, Q.F16, Q.Q8_0, Q.Q4_0, (Q.F16, Q.Q4_0)],
                         ids=lambda t: t.name if isinstance(t, Q) else "-".join(x.name for x in t))
@pytest.mark.parametrize("n_tokens,window,hd,page_size,max_spans", [
    (1, 0, 64, 16, 0), (1, 0, 64, 64, 8), (6, 0, 64, 32, 0), (1, 100, 256, 16, 0), (1, 100, 256, 128, 8),
    (5, 100, 256, 64, 0), (1, 0, 64, 16, 2)])
def test_simd_attention_matches_its_scalar_twin(t, n_tokens, window, hd, page_size, max_spans):
    """Span-by-span softmax with a polynomial exp, query heads sharing a pass over their kv head,
    or a lone token's spans spread as work items and merged (max_spans > 0; 2 is too few for
    300 positions and takes the sequential path), against the row-at-a-time scalar reference
    over 300 positions in scrambled pages."""
    seed = sum(int(x) for x in (t if isinstance(t, tuple) else (t,)))
    rng = np.random.default_rng(500 + seed + n_tokens + hd)
    n_head, n_kv, n_pos = 8, 2, 300
    cache = PagedCache(t, n_kv, hd, n_pos, page_size, window, seed=seed)
    k = (rng.standard_normal((n_pos, n_kv, hd)) * 2).astype(np.float32)
    v = rng.standard_normal((n_pos, n_kv, hd)).astype(np.float32)
    cache.store(k, v, np.arange(n_pos, dtype=np.int32))
    pos = np.arange(n_pos - n_tokens, n_pos, dtype=np.int32)
    q = rng.standard_normal((n_tokens, n_head, hd)).astype(np.float32)
    fast = cache.attend(q, pos, n_head, hd ** -0.5, max_spans=max_spans)
    ref = cache.attend(q, pos, n_head, hd ** -0.5, ref=True)
    np.testing.assert_allclose(fast, ref, rtol=2e-5, atol=1e-5)  # outputs are O(1): float order


@pytest.mark.parametrize("t", [Q.F32, Q.F16, Q.Q8_0], ids=lambda t: t.name)
@pytest.mark.parametrize("half", [0, 37])
def test_bidirectional_attention_matches_its_scalar_twin_and_batching(t, half):
    """An encoder's queries see their whole input (half 0) or p +- half of it (a symmetric sliding
    layer): the span kernel against the scalar reference over 300 positions, and each query's
    bits the same alone, split over spans, and in the block."""
    rng = np.random.default_rng(90 + half)
    n_head, n_kv, hd, n_pos = 8, 2, 64, 300
    cache = PagedCache(t, n_kv, hd, n_pos, 16, seed=5, half_window=half)
    cache.store((rng.standard_normal((n_pos, n_kv, hd)) * 2).astype(np.float32),
                rng.standard_normal((n_pos, n_kv, hd)).astype(np.float32), np.arange(n_pos, dtype=np.int32))
    rows = np.array([0, 1, 20, 150, 262, 298, 299], np.int32)
    seen = np.full(len(rows), n_pos - 1, np.int32)
    q = rng.standard_normal((len(rows), n_head, hd)).astype(np.float32)
    block = cache.attend(q, rows, n_head, 0.125, seen=seen)
    np.testing.assert_allclose(block, cache.attend(q, rows, n_head, 0.125, ref=True, seen=seen), rtol=2e-5, atol=1e-5)
    for i in range(len(rows)):
        one = (q[i:i + 1].copy(), rows[i:i + 1].copy(), n_head, 0.125)
        alone, split = cache.attend(*one, seen=seen[:1]), cache.attend(*one, max_spans=20, seen=seen[:1])
        assert np.array_equal(alone[0], block[i]) and np.array_equal(split[0], block[i])
    causal = cache.attend(q, rows, n_head, 0.125)
    assert not np.allclose(causal[:-1], block[:-1], atol=1e-3)  # the rows after a query move it


@pytest.mark.parametrize("n_head", [8, 6])  # 6: past the power of two, the second slope series
def test_alibi_attention(n_head):
    """jina-bert-v2's ALiBi (max bias 8): each score plus slope_h * -|i - j|, bidirectional, against
    numpy with ggml's slopes; the span kernel against the scalar twin, each query's bits the same
    alone, split over spans and in the block; and the bias visibly moves the output."""
    rng = np.random.default_rng(44)
    n_kv, hd, n_pos = 2, 64, 150
    cache = PagedCache(Q.F32, n_kv, hd, n_pos, 16, seed=2)
    k, v = (rng.standard_normal((n_pos, n_kv, hd)).astype(np.float32) for _ in range(2))
    cache.store(k, v, np.arange(n_pos, dtype=np.int32))
    rows = np.array([0, 5, 70, 149], np.int32)
    seen = np.full(len(rows), n_pos - 1, np.int32)
    q = rng.standard_normal((len(rows), n_head, hd)).astype(np.float32)
    got = cache.attend(q, rows, n_head, 0.125, seen=seen, alibi=8.0)
    slopes = alibi_slopes(n_head, 8.0)
    for i, p in enumerate(rows):
        for h in range(n_head):
            g = h // (n_head // n_kv)
            s = k[:, g].astype(np.float64) @ q[i, h] * 0.125 - slopes[h] * np.abs(p - np.arange(n_pos))
            w = np.exp(s - s.max())
            np.testing.assert_allclose(got[i, h], (w / w.sum()) @ v[:, g], rtol=1e-4, atol=1e-5)
    ref = cache.attend(q, rows, n_head, 0.125, ref=True, seen=seen, alibi=8.0)
    np.testing.assert_allclose(got, ref, rtol=2e-5, atol=1e-5)
    for i in range(len(rows)):
        one = (q[i:i + 1].copy(), rows[i:i + 1].copy(), n_head, 0.125)
        alone = cache.attend(*one, seen=seen[:1], alibi=8.0)
        split = cache.attend(*one, max_spans=12, seen=seen[:1], alibi=8.0)
        assert np.array_equal(alone[0], got[i]) and np.array_equal(split[0], got[i])
    assert not np.allclose(got, cache.attend(q, rows, n_head, 0.125, seen=seen), atol=1e-2)


@pytest.mark.parametrize("t", [Q.F32, Q.Q8_0, Q.Q4_0], ids=lambda t: t.name)
def test_attention_is_the_same_bits_however_it_is_batched(t):
    """A token's output alone, split over spans by the threads' path, and inside a block of
    other tokens: identical bits (the batch-invariance contract of attention.c)."""
    rng = np.random.default_rng(7)
    n_head, n_kv, hd, n_pos = 8, 2, 64, 200
    cache = PagedCache(t, n_kv, hd, n_pos, 16, seed=3)
    cache.store(rng.standard_normal((n_pos, n_kv, hd)).astype(np.float32),
                rng.standard_normal((n_pos, n_kv, hd)).astype(np.float32), np.arange(n_pos, dtype=np.int32))
    q = rng.standard_normal((7, n_head, hd)).astype(np.float32)
    rows = np.arange(150, 157, dtype=np.int32)
    block = cache.attend(q, rows, n_head, 0.125)
    for i, r in enumerate(rows):
        alone = cache.attend(q[i:i + 1].copy(), rows[i:i + 1].copy(), n_head, 0.125)
        split = cache.attend(q[i:i + 1].copy(), rows[i:i + 1].copy(), n_head, 0.125, max_spans=4)
        assert np.array_equal(alone[0], block[i]) and np.array_equal(split[0], block[i])


@pytest.mark.parametrize("t", [Q.F32, Q.F16, Q.Q8_0], ids=lambda t: t.name)
def test_softcapped_attention(t):
    """Scores capped as Gemma 2 caps them, s -> c tanh(s / c): the SIMD path against the scalar
    reference (libm's tanhf), both against numpy, and the same bits alone, split or in a block."""
    rng = np.random.default_rng(8)
    n_head, n_kv, hd, n_pos, cap = 8, 2, 64, 200, 5.0
    cache = PagedCache(t, n_kv, hd, n_pos, 16, seed=4)
    k = (rng.standard_normal((n_pos, n_kv, hd)) * 2).astype(np.float32)
    cache.store(k, rng.standard_normal((n_pos, n_kv, hd)).astype(np.float32), np.arange(n_pos, dtype=np.int32))
    q = rng.standard_normal((5, n_head, hd)).astype(np.float32)
    rows = np.arange(120, 125, dtype=np.int32)
    block = cache.attend(q, rows, n_head, 0.125, softcap=cap)
    ref = cache.attend(q, rows, n_head, 0.125, ref=True, softcap=cap)
    np.testing.assert_allclose(block, ref, rtol=2e-5, atol=1e-5)
    K, V = cache.rows(0, n_pos), cache.rows(1, n_pos)
    for i, p in enumerate(rows):
        for h in range(n_head):
            s = K[h // 4, :p + 1] @ q[i, h].astype(np.float64) * 0.125
            w = np.exp(cap * np.tanh(s / cap) - cap)
            np.testing.assert_allclose(block[i, h], (w / w.sum()) @ V[h // 4, :p + 1], rtol=1e-4, atol=1e-5)
        alone = cache.attend(q[i:i + 1].copy(), rows[i:i + 1].copy(), n_head, 0.125, softcap=cap)
        split = cache.attend(q[i:i + 1].copy(), rows[i:i + 1].copy(), n_head, 0.125, max_spans=4, softcap=cap)
        assert np.array_equal(alone[0], block[i]) and np.array_equal(split[0], block[i])
    uncapped = cache.attend(q, rows, n_head, 0.125)
    assert np.abs(uncapped - block).max() > 1e-2  # the cap changes the result: scores reach past it


@pytest.mark.parametrize("t", [Q.F32, Q.F16, Q.Q8_0], ids=lambda t: t.name)
def test_attention_sinks(t):
    """gpt-oss's sinks: a logit per head in the softmax's denominator with no value row. The SIMD
    path against the scalar reference and numpy in float64, the same bits alone, split or in a
    block; sinks from far below the scores (no effect) to far above (most of the weight)."""
    rng = np.random.default_rng(9)
    n_head, n_kv, hd, n_pos = 8, 2, 64, 200
    cache = PagedCache(t, n_kv, hd, n_pos, 16, seed=5)
    cache.store(rng.standard_normal((n_pos, n_kv, hd)).astype(np.float32),
                rng.standard_normal((n_pos, n_kv, hd)).astype(np.float32), np.arange(n_pos, dtype=np.int32))
    q = rng.standard_normal((5, n_head, hd)).astype(np.float32)
    sinks = np.array([-30.0, -2.0, 0.0, 0.5, 1.0, 2.0, 4.0, 8.0], np.float32)
    rows = np.array([0, 63, 64, 130, 199], np.int32)
    block = cache.attend(q, rows, n_head, 0.125, sinks=sinks)
    ref = cache.attend(q, rows, n_head, 0.125, ref=True, sinks=sinks)
    np.testing.assert_allclose(block, ref, rtol=2e-5, atol=1e-6)
    K, V = cache.rows(0, n_pos), cache.rows(1, n_pos)
    for i, p in enumerate(rows):
        for h in range(n_head):
            s = K[h // 4, :p + 1] @ q[i, h].astype(np.float64) * 0.125
            m = max(s.max(), sinks[h])
            w = np.exp(s - m)
            np.testing.assert_allclose(block[i, h], w @ V[h // 4, :p + 1] / (w.sum() + np.exp(sinks[h] - m)),
                                       rtol=1e-4, atol=1e-6)
        alone = cache.attend(q[i:i + 1].copy(), rows[i:i + 1].copy(), n_head, 0.125, sinks=sinks)
        split = cache.attend(q[i:i + 1].copy(), rows[i:i + 1].copy(), n_head, 0.125, max_spans=4, sinks=sinks)
        assert np.array_equal(alone[0], block[i]) and np.array_equal(split[0], block[i])
    plain = cache.attend(q, rows, n_head, 0.125)
    assert np.array_equal(plain[:, 0], block[:, 0])  # a sink far below the scores changes no bit
    assert np.abs(plain[:, 7] - block[:, 7]).max() > 1e-2  # one far above takes most of the weight


@pytest.mark.parametrize("target", ["native", "x86-64-v3"])
def test_geglu_table_equals_direct_evaluation(target):
    """GELU by lookup on the input's f16 bits, on each SIMD path (AVX-512's gather natively, AVX2's
    on x86-64-v3): identical to evaluating it, for every f16 value, the values between them, and
    both sides of the +-10 cut-offs."""
    from compiler.build import targets

    if target != "native" and targets.missing_features(target):
        pytest.skip(f"this CPU cannot run {target}")
    k = K if target == "native" else runtime_kernels(target=target)
    halves = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32)
    x = np.concatenate([halves[np.isfinite(halves)], np.linspace(-12, 12, 100_001, dtype=np.float32)])
    up = np.random.default_rng(9).standard_normal(x.size).astype(np.float32)
    fast, ref = np.zeros_like(x), np.zeros_like(x)
    f32 = lambda a: k.ffi.cast("float *", k.ffi.from_buffer(a))  # noqa: E731
    k.lib.kiln_geglu(f32(fast), f32(x), f32(up), x.size)
    k.lib.kiln_geglu_ref(f32(ref), f32(x), f32(up), x.size)
    assert np.array_equal(fast, ref)


X8_TYPES = [d.value for d in X8_DTYPES]  # the one list of the x8 layout's types (compiler/core/dtypes.py)


@pytest.mark.parametrize("t", X8_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("n_out,rows", [(8, 1), (48, 1), (48, 6), (24, 19)])
def test_x8_packed_matmul_matches_reference_dots(t, n_out, rows):
    """Weights interleaved by eight rows at load, against one activation row (decode) or a
    chunk (8 rows share each unpacked block, then the remainder): the scalar references' bits.
    The packed copy is as large as the GGUF rows, or, for Q4_K and Q5_K, 32 bytes a super-block
    of 8 rows larger (Q3_K too, 16 for IQ4_XS; dtypes.x8_bytes)."""
    from compiler.core.dtypes import DType, x8_bytes

    n_in = 768 if GGML_QUANT_SIZES[t][0] == 256 else 576
    if not lib.kiln_x8_supported(int(t), n_out, n_in):
        pytest.skip("this build has no x8 kernel (needs AVX-512 VNNI)")
    rng = np.random.default_rng(600 + int(t) + n_out + rows)
    _, w = quantized(rng, n_out, n_in, t)
    if t is Q.MXFP4:  # E8M0 scales down to e = 0 and 1, whose 2^(e - 128) the kernels make as denormals,
        blocks = w.reshape(n_out, -1, 17)  # in every block of half the rows, so that nothing larger hides them
        tiny = (np.arange(n_out) % 2 == 0)[:, None]
        blocks[:, :, 0] = np.where(tiny, rng.integers(0, 4, blocks.shape[:2]), rng.integers(100, 140, blocks.shape[:2]))
    size = lib.kiln_x8_bytes(int(t), n_out, n_in)
    extra = {Q.Q4_K: 32, Q.Q5_K: 32, Q.IQ4_XS: 16, Q.Q3_K: 32}.get(t, 0)  # a super-block of 8 rows' scales as bytes
    assert size == x8_bytes(DType[t.name], n_out, n_in) == w.size + extra * n_out // 8 * n_in // 256
    packed = np.zeros(size, np.uint8)
    lib.kiln_pack_x8(int(t), ptr(w), ptr(packed), n_out, n_in)
    assert not np.array_equal(packed[:w.size], w.reshape(-1))
    x = rng.standard_normal((rows, n_in)).astype(np.float32)
    bias = rng.standard_normal(n_out).astype(np.float32)
    if t is Q.MXFP4:
        bias[tiny[:, 0]] = 0.0  # which would swallow those rows' values
    y = np.zeros((rows, n_out), np.float32)
    scratch = np.zeros(lib.kiln_matmul_scratch_bytes(int(t), rows, n_in), np.uint8)
    lib.kiln_matmul_x8(int(t), ptr(packed), ptr(w), ptr(bias, "float *"), n_out, n_in, ptr(x, "float *"), rows,
                       ptr(y, "float *"), ptr(scratch))
    act = quantized_rows(t, x)
    want = np.array([[lib.kiln_vec_dot_ref(int(t), n_in, ptr(w[o]), ptr(act[r])) for o in range(n_out)]
                     for r in range(rows)], np.float32) + bias
    np.testing.assert_array_equal(y, want)


@pytest.mark.parametrize("t", [t for t in X8_TYPES if t not in K_TYPES], ids=lambda t: t.name)
@pytest.mark.parametrize("n_in,rows", [(1536, 41), (4096, 150)])
def test_x8_matmul_takes_the_same_bits_with_amx_on_or_off(t, n_in, rows):
    """Where the CPU and the OS allow AMX, prefill's integer sums come from tile multiplies (16
    rows at a time, the rest by VNNI); every float step after them is the VNNI path's, so the
    results must be the same bits either way, rows of a full tile and of the remainder alike.
    41 rows: two tiles of 16 in one pass over the weights, then 8 rows and single rows by VNNI;
    150 rows of 4096 inputs: passes of 64, 64 and 16 rows (the stack holds 64 such rows)."""
    if not lib.kiln_amx(-1):
        pytest.skip("no AMX here (this build, the CPU or the OS)")
    rng = np.random.default_rng(800 + int(t) + n_in)
    n_out = 48
    _, w = quantized(rng, n_out, n_in, t)
    packed = np.zeros(lib.kiln_x8_bytes(int(t), n_out, n_in), np.uint8)
    lib.kiln_pack_x8(int(t), ptr(w), ptr(packed), n_out, n_in)
    x = rng.standard_normal((rows, n_in)).astype(np.float32)
    same_bits_with_amx_on_or_off(t, w, x, lambda y, scratch: lib.kiln_matmul_x8(
        int(t), ptr(packed), ptr(w), ffi.NULL, n_out, n_in, ptr(x, "float *"), rows, ptr(y, "float *"), ptr(scratch)))


def same_bits_with_amx_on_or_off(t, w, x, matmul):
    """matmul(y, scratch) with AMX on, then off: the same bits, and the scalar reference's."""
    rows, n_in, n_out = len(x), x.shape[1], len(w)
    scratch = np.zeros(lib.kiln_matmul_scratch_bytes(int(t), rows, n_in), np.uint8)
    y = np.zeros((2, rows, n_out), np.float32)
    try:
        for i, amx in enumerate((1, 0)):
            lib.kiln_amx(amx)
            matmul(y[i], scratch)
    finally:
        lib.kiln_amx(1)
    assert np.array_equal(y[0], y[1])
    act = quantized_rows(t, x)
    want = np.array([[lib.kiln_vec_dot_ref(int(t), n_in, ptr(w[o]), ptr(act[r])) for o in range(n_out)]
                     for r in range(rows)], np.float32)
    np.testing.assert_array_equal(y[0], want)


@pytest.mark.parametrize("t", [t for t in BLOCK_TYPES if GGML_QUANT_SIZES[t][0] == 256 and t not in K_TYPES],
                         ids=lambda t: t.name)
def test_super_block_tiles_take_the_same_bits_with_amx_on_or_off(t):
    """The super-block types' prefill tiles (rows_sb_avx2.c) are AMX weight tiles as they are: where
    AMX is allowed, it takes every activation row, 16 at a time, each span's integer sums from a tile
    multiply of signed bytes, every step after them sb_gemm's; without it, VNNI's q + 128. 41 rows:
    three groups of 16, the last 9 rows and 7 of zeros; 17 weight rows: a tile of 16 and one of 1.
    The same bits either way, and the scalar reference's."""
    if not lib.kiln_amx(-1):
        pytest.skip("no AMX here (this build, the CPU or the OS)")
    rng = np.random.default_rng(850 + int(t))
    n_out, n_in, rows = 17, 1536, 41
    _, w = quantized(rng, n_out, n_in, t)
    x = rng.standard_normal((rows, n_in)).astype(np.float32)
    same_bits_with_amx_on_or_off(t, w, x, lambda y, scratch: lib.kiln_matmul(
        int(t), ptr(w), ffi.NULL, n_out, n_in, ptr(x, "float *"), rows, ptr(y, "float *"), ptr(scratch)))


def test_x8_matmul_without_a_packed_copy_reads_the_gguf_rows():
    rng = np.random.default_rng(700)
    n_out, n_in, rows = 16, 256, 3
    _, w = quantized(rng, n_out, n_in, Q.Q4_1)
    x = rng.standard_normal((rows, n_in)).astype(np.float32)
    y, want = np.zeros((2, rows, n_out), np.float32)
    scratch = np.zeros(lib.kiln_matmul_scratch_bytes(int(Q.Q4_1), rows, n_in), np.uint8)
    lib.kiln_matmul_x8(int(Q.Q4_1), ffi.NULL, ptr(w), ffi.NULL, n_out, n_in, ptr(x, "float *"), rows,
                       ptr(y, "float *"), ptr(scratch))
    lib.kiln_matmul(int(Q.Q4_1), ptr(w), ffi.NULL, n_out, n_in, ptr(x, "float *"), rows, ptr(want, "float *"),
                    ptr(scratch))
    assert np.array_equal(y, want)


@pytest.mark.parametrize("t", _with_twin(lib.KILN_SIMD_DEQUANT), ids=lambda t: t.name)
def test_simd_dequantizer_is_exact(t):
    """The dispatched dequantizer (AVX2 for the f16 and q8_0 KV caches) gives the scalar reference's values."""
    rng = np.random.default_rng(800 + int(t))
    _, raw = quantized(rng, 4, 512, t)
    fast, ref = np.zeros((2, 4, 512), np.float32)
    for r in range(4):
        lib.kiln_dequantize_row(int(t), ptr(raw[r]), ptr(fast[r], "float *"), 512)
        lib.kiln_dequantize_row_ref(int(t), ptr(raw[r]), ptr(ref[r], "float *"), 512)
    assert np.array_equal(fast, ref)


@pytest.mark.parametrize("t", _with_twin(lib.KILN_SIMD_STORE), ids=lambda t: t.name)
def test_simd_row_quantizer_is_bit_exact(t):
    """The dispatched KV-cache row quantizer (f16 and q8_0, AVX2 or NEON where built) writes the scalar
    reference's bytes. For f16 (whose reference GCC makes a libgcc call a value on x86): values halfway
    between two halves (ties to even), at and past the largest half (to inf), below the smallest normal
    and halfway to the smallest subnormal, signed zeros, infinities and NaNs, and a tail past the last
    vector of 8 that goes one by one."""
    rng = np.random.default_rng(900 + int(t))
    n = 34 * 32 + (3 if t == Q.F16 else 0)
    x = (rng.standard_normal((4, n)) * np.float32(4.0) ** rng.integers(-12, 9, (4, n))).astype(np.float32)
    odd = np.array([65504.0, 65519.0, 65520.0, -65520.0, 1e6, 2.0 ** -25, 3 * 2.0 ** -25, 1e-8, -1e-8, 2.0 ** -14,
                    1 + 2.0 ** -11, 1 + 3 * 2.0 ** -11, -(1 + 2.0 ** -11), 0.0, -0.0, np.inf, -np.inf, np.nan],
                   np.float32)
    if t == Q.F16:
        x[0, :odd.size], x[1, -odd.size:] = odd, odd[::-1]
    for r in range(len(x)):
        fast = np.zeros(lib.kiln_row_bytes(int(t), n), np.uint8)
        ref = np.zeros_like(fast)
        lib.kiln_quantize_row(int(t), ptr(x[r], "float *"), ptr(fast), n)
        lib.kiln_quantize_row_ref(int(t), ptr(x[r], "float *"), ptr(ref), n)
        assert np.array_equal(fast, ref), f"row {r}: first differing byte {np.flatnonzero(fast != ref)[:1]}"


def test_hadamard_blocks_are_sylvesters_orthonormal_matrix():
    """kiln_hadamard multiplies each block of 64 by H_64 / 8 (Sylvester's construction, the matrix
    llama.cpp rotates a quantized cache by), which is its own inverse."""
    h = np.array([[1.0]])
    while h.shape[0] < 64:
        h = np.block([[h, h], [h, -h]])
    x = np.random.default_rng(9).standard_normal((3, 128)).astype(np.float32)
    y = np.zeros_like(x)
    lib.kiln_hadamard(ptr(y, "float *"), ptr(x, "float *"), x.size)
    want = (x.reshape(-1, 64).astype(np.float64) @ (h / 8).T).reshape(x.shape)
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)
    back = np.zeros_like(x)
    lib.kiln_hadamard(ptr(back, "float *"), ptr(y, "float *"), x.size)
    np.testing.assert_allclose(back, x, rtol=1e-5, atol=1e-5)


def test_the_iq_tables_header_is_gguf_pys():
    """runtime_c/iq_tables.h is what compiler/tools/iq_tables.py writes from gguf-py's tables today."""
    from compiler.core.paths import RUNTIME_DIR
    from compiler.tools.iq_tables import header
    assert (RUNTIME_DIR / "iq_tables.h").read_text() == header()
