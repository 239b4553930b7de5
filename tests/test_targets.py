"""The same bits on every CPU target: the runtime built for plain x86-64 (scalar C), x86-64-v2,
x86-64-v3 (AVX2), x86-64-v4 (AVX-512) and this CPU (native: VNNI, AMX where it has them) must
each build, load and run, and give the scalar build's logits bit for bit.

Each path computes every value in the scalar reference's order of operations (runtime_c/vec_f32.h,
ref_quant.c), so a token's logits do not depend on the instruction set, as they do not depend on
the batch. A target this CPU cannot run is skipped, naming the features it lacks.
"""
from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

import compiler
from compiler.build import targets as build
from compiler.core.errors import BuildError
from compiler.tools.synthetic import FEATURE_MODELS, FEATURE_SHAPE
from synthetic import TinySpec, write_tiny_model

SCALAR = "x86-64"
TARGETS = [t for t in build.TARGETS if t != SCALAR]
STEPS = 32


def runnable(target: str) -> None:
    missing = build.missing_features(target)
    if missing:
        pytest.skip(f"this CPU cannot run {target}: it lacks {', '.join(missing)}")


@pytest.fixture(scope="module")
def golden_model(tmp_path_factory):
    """The golden example's tiny llama (generated/examples/tiny-llama)."""
    return write_tiny_model(tmp_path_factory.mktemp("targets") / "tiny-llama.gguf",
                            TinySpec(arch="llama", wtype=Q.Q8_0))


def tiny_run(path, target: str) -> dict[str, np.ndarray]:
    """A prompt's logits in one chunk and token by token, then 32 greedy steps' logits."""
    m = compiler.load(path, ctx=64, prefill_chunk=16, target=target)
    ids = [1, 5, 9, 44, 100, 200, 31, 7, 250, 3, 66]
    chunk = m.prefill(ids, logits="all")
    m.reset()
    one_by_one = np.stack([m.decode(t) for t in ids])
    steps, token = [], int(chunk[-1].argmax())
    for _ in range(STEPS):
        steps.append(m.decode(token))
        token = int(steps[-1].argmax())
    return {"chunk": chunk, "one_by_one": one_by_one, "steps": np.stack(steps)}


def smollm2_tokens(path, target: str) -> list[int]:
    m = compiler.load(path, ctx=256, target=target)
    ids = m.tokenize("Once upon a time, in a small village,")
    logits, out = m.prefill(ids), []
    for _ in range(STEPS):
        out.append(int(logits.argmax()))
        logits = m.decode(out[-1])
    return out


@pytest.fixture(scope="module")
def scalar_tiny(golden_model):
    return tiny_run(golden_model, SCALAR)


@pytest.fixture(scope="module")
def scalar_smollm2(smollm2):
    return smollm2_tokens(smollm2, SCALAR)


def test_the_scalar_build_is_batch_invariant(scalar_tiny):
    np.testing.assert_array_equal(scalar_tiny["chunk"], scalar_tiny["one_by_one"])


@pytest.mark.parametrize("target", TARGETS)
def test_golden_model_logits_are_the_scalar_builds_bit_for_bit(golden_model, scalar_tiny, target):
    runnable(target)
    got = tiny_run(golden_model, target)
    for part in ("chunk", "one_by_one", "steps"):
        np.testing.assert_array_equal(got[part], scalar_tiny[part], err_msg=f"{target}: {part}")


# the new architectures' own code that has SIMD spellings: the soft-capped scores and logits
# (tanh), and the scaled ropes and fused weights they run beside; the experts (moe.c: x8 tiles or GGUF rows by target)
FEATURES = ["gemma2", "qwen2-yarn", "phi3-long", "granite", "qwen3moe"]


@pytest.fixture(scope="module")
def feature_runs(tmp_path_factory):
    """Each feature model, and its scalar build's run."""
    out = {}
    for name in FEATURES:
        spec = TinySpec(**dict(FEATURE_SHAPE, **FEATURE_MODELS[name]), wtype=Q.Q8_0)
        path = write_tiny_model(tmp_path_factory.mktemp("targets") / f"{name}.gguf", spec)
        out[name] = path, tiny_run(path, SCALAR)
    return out


@pytest.mark.parametrize("target", TARGETS)
def test_new_architectures_logits_are_the_scalar_builds_bit_for_bit(feature_runs, target):
    runnable(target)
    for name, (path, scalar) in feature_runs.items():
        got = tiny_run(path, target)
        for part in ("chunk", "one_by_one", "steps"):
            np.testing.assert_array_equal(got[part], scalar[part], err_msg=f"{name} on {target}: {part}")


@pytest.mark.parametrize("target", TARGETS)
def test_smollm2_greedy_tokens_are_the_scalar_builds(smollm2, scalar_smollm2, target):
    runnable(target)
    assert smollm2_tokens(smollm2, target) == scalar_smollm2


def test_a_target_this_cpu_lacks_is_refused_by_name(monkeypatch, golden_model):
    monkeypatch.setattr(build, "missing_features", lambda target: ["avx512f", "avx512bw"] if target != "native" else [])
    with pytest.raises(BuildError, match=r"target x86-64-v4 needs avx512f, avx512bw, which this CPU lacks"):
        compiler.load(golden_model, ctx=64, target="x86-64-v4")


def test_an_unknown_target_is_refused_by_name(golden_model):
    with pytest.raises(BuildError, match=r"unknown target 'pentium4'.*x86-64-v3"):
        compiler.load(golden_model, ctx=64, target="pentium4")


@pytest.mark.parametrize("isa", ["no-amx", "no-vnni", "no-avx512"])
def test_an_isa_switch_leaves_a_path_out_and_keeps_the_bits(golden_model, scalar_tiny, isa):
    """--isa builds native without some extensions, so every path runs on one CPU: the kernel set it
    reports loses them, and the logits stay the scalar build's."""
    full, less = build.kernel_set(False, "native"), build.kernel_set(False, "native", build.isa_switch(isa))
    lost = {"no-amx": "AMX", "no-vnni": "VNNI", "no-avx512": "VNNI"}[isa]
    assert lost not in less and (lost in full or full == less)
    m = compiler.load(golden_model, ctx=64, prefill_chunk=16, isa=isa)
    assert isa in m.compiled.extension.isa
    np.testing.assert_array_equal(m.prefill([1, 5, 9, 44, 100, 200, 31, 7, 250, 3, 66], logits="all"),
                                  scalar_tiny["chunk"])


def test_an_unknown_isa_switch_is_refused_by_name(golden_model, monkeypatch):
    with pytest.raises(BuildError, match=r"unknown no-sse.*no-amx"):
        compiler.load(golden_model, ctx=64, isa="no-sse")
    monkeypatch.setenv("KILN_ISA", "no-amx,bogus")
    with pytest.raises(BuildError, match=r"KILN_ISA: unknown bogus"):
        compiler.load(golden_model, ctx=64)


X8_TYPES = [Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.Q4_K, Q.Q5_K, Q.Q6_K]
# each GGUF block's bytes that hold values (not the f16 scales): (block bytes, value ranges, fill)
VALUE_BYTES = {Q.Q4_0: (18, [(2, 18)], 0xFF), Q.Q4_1: (20, [(4, 20)], 0xFF), Q.Q5_0: (22, [(2, 22)], 0xFF),
               Q.Q5_1: (24, [(4, 24)], 0xFF), Q.Q8_0: (34, [(2, 34)], 0x80), Q.Q4_K: (144, [(4, 144)], 0xFF),
               Q.Q5_K: (176, [(4, 176)], 0xFF), Q.Q6_K: (210, [(0, 192)], 0xFF)}


def _extreme(w: np.ndarray, t: Q) -> np.ndarray:
    """Weights of the largest magnitude each type holds: u = 15, 31 or 63 (K-quants with scales 63), q = -128."""
    size, ranges, fill = VALUE_BYTES[t]
    blocks = w.reshape(w.shape[0], -1, size).copy()
    for a, b in ranges:
        blocks[:, :, a:b] = fill
    return blocks.reshape(w.shape)


@pytest.mark.parametrize("target", ["x86-64-v3", "x86-64-v4", "avx512-vnni", "native"])
def test_x8_kernels_of_each_target_give_the_reference_dots(target):
    """The matmuls on the x8 layout (AVX2's x8_avx2.c on x86-64-v3 and -v4, AVX-512 VNNI's x8_vnni.c
    above them), every weight type, one activation row and chunks with remainders: the scalar
    reference dot's bits for every (row, output) pair, the weights at their extremes included (a
    weight 15 or 31 or 63 against activations of +-127 is where 16-bit pair sums would overflow)."""
    runnable(target)
    from compiler.build.runtime import runtime_kernels
    from test_kernels import quantized

    K = runtime_kernels(target=target)
    ffi, lib = K.ffi, K.lib
    assert lib.kiln_x8_kernels() == 1

    def ptr(a, t="void *"):
        return ffi.cast(t, ffi.from_buffer(a))
    for t in X8_TYPES:
        n_in = 768 if t in (Q.Q4_K, Q.Q5_K, Q.Q6_K) else 576
        for n_out, rows in [(8, 1), (48, 1), (48, 6), (24, 19)]:
            rng = np.random.default_rng(900 + int(t) + n_out + rows)
            _, w = quantized(rng, n_out, n_in, t)
            if rows == 6:  # every weight at its largest magnitude: all bits of the values set, scales kept
                w = _extreme(w, t)
            packed = np.zeros(lib.kiln_x8_bytes(int(t), n_out, n_in), np.uint8)
            lib.kiln_pack_x8(int(t), ptr(w), ptr(packed), n_out, n_in)
            x = rng.standard_normal((rows, n_in)).astype(np.float32)
            if rows == 6:  # against activations that all quantize to +127 or -127, the largest sums
                x = np.where(np.arange(rows)[:, None] % 2 == 0, 3.0, -3.0).astype(np.float32) * np.ones_like(x)
            y = np.zeros((rows, n_out), np.float32)
            scratch = np.zeros(rows * lib.kiln_act_row_bytes(int(t), n_in), np.uint8)
            lib.kiln_matmul_x8(int(t), ptr(packed), ptr(w), ffi.NULL, n_out, n_in, ptr(x, "float *"), rows,
                               ptr(y, "float *"), ptr(scratch))
            act = np.zeros((rows, lib.kiln_act_row_bytes(int(t), n_in)), np.uint8)
            for r in range(rows):
                lib.kiln_quantize_act(int(t), ptr(x[r]), ptr(act[r]), n_in)
            want = np.array([[lib.kiln_vec_dot_ref(int(t), n_in, ptr(w[o]), ptr(act[r])) for o in range(n_out)]
                             for r in range(rows)], np.float32)
            np.testing.assert_array_equal(y, want, err_msg=f"{target} {t.name} {n_out}x{rows}")
