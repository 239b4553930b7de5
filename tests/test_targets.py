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
