"""The architectures beyond the plain blocks, each a template plus at most a new op, against
llama.cpp on the same tiny synthetic GGUF (compiler/tools/synthetic.py FEATURE_MODELS): Llama 3's
rope frequency factors, linear and YaRN RoPE scaling, granite's scalars, Phi-3's fused tensors and
LongRoPE (long and short factors), Gemma 2's soft-caps, alternating sliding windows and post-norms,
the mixtures of experts (their routing's bits: tests/test_moe.py).

The rope. Each layer's rope of every feature model (and of a few more YaRN files) is ggml's rope
run with the parameters llama.cpp's own graph gives it, read from its nodes, bit for bit, at
positions far past the original contexts: the parameters kiln derives (compiler/ir/rope.py) and
its kernel's arithmetic (runtime_c/ops.c) are llama.cpp's to the last bit.

The logits, at the control's floor. With F32 weights on models whose norms are raised, so that
the layers move the logits, plain llama (the control) agrees with llama.cpp to a mean KL of 2e-13
(f32 caches on both sides): the same arithmetic but for the order of a few sums, which leaves the
logits an ulp apart. Every feature model must land at that floor too: a bound of 1e-9, four
orders above the control (Gemma 2 lands at 2e-11: its GELU rounds through f16, as llama.cpp's
table does, and an ulp apart sometimes rounds the other way). Each model with its feature switched
off (FEATURE_OFF: no factors, no scaling, scalars at 1, default caps) misses that bound by a wide
margin (measured 3.9e-4 to 1.7, asserted above 1e-6), so the feature is what the test sees.

Q8_0 weights agree less closely, for a reason that is not the features': both engines quantize
each activation to 8 bits before a matmul, and where their values are an ulp apart (kiln's
attention sums by spans; its SwiGLU's exp and RMSNorm's sum are its own, not ggml's), now and then
one rounds to the other step and the cache carries it on. The control does it too, on some seeds.
That test holds the quantized path to 1e-6, five times the largest such event measured on it.
"""
from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

import compiler
from compiler.build.runtime import runtime_kernels
from compiler.codegen.emit import rope_scaled
from compiler.core.options import CompileOptions
from compiler.passes.rope_table import table_node
from compiler.planner.plan import plan
from compiler.tools.synthetic_features import FEATURE_MODELS, FEATURE_OFF, FEATURE_SHAPE
from ggml_ops import ROPE_NEOX, llamacpp_ropes, rope
from reference import Reference, compare, kiln_greedy

FEATURES = list(FEATURE_MODELS)
CONTROL = {"control": dict(arch="llama")}  # the plain blocks: what kiln's arithmetic gives without a feature
FLOOR = 1e-9  # the control's measured 2e-13, four orders up
MISSES = 1e-6  # where a model without its feature must land, at least: three orders above the floor


def _yarn(arch: str, factor: float, original: int, **more) -> dict:
    return dict(arch=arch, rope_base=10000.0, extra_meta={"rope.scaling.type": "yarn", "rope.scaling.factor": factor,
                                                          "rope.scaling.original_context_length": original, **more})


# More YaRN for the rope's bits alone: factors where the magnitude's bits depend on taking ln
# from libm's logf rather than numpy's float32 log (9.25) and on rope_yarn's 1 + 0.1 ln(factor)
# being one fma (5.25); a ramp over eight dimensions, where dividing by its width and multiplying
# by the inverse part ways (an original context of 256); a file with YaRN's betas, which
# llama.cpp leaves at 32 and 1 for these architectures
ROPE_VARIANTS = {"qwen2-yarn-5.25": _yarn("qwen2", 5.25, 32), "qwen2-yarn-9.25": _yarn("qwen2", 9.25, 32),
                 "qwen3-yarn-ramp": _yarn("qwen3", 8.0, 256),
                 "qwen2-yarn-betas": _yarn("qwen2", 4.0, 32, **{"rope.scaling.yarn_beta_fast": 3.0,
                                                                "rope.scaling.yarn_beta_slow": 0.125})}
MODELS = CONTROL | FEATURE_MODELS | ROPE_VARIANTS


def feature_model(tiny, smollm2, name: str, wtype=Q.Q8_0, raised: bool = False, off: bool = False):
    spec = dict(FEATURE_SHAPE, **(FEATURE_OFF if off else MODELS)[name], wtype=wtype, tokenizer_from=smollm2)
    if raised:
        spec["norm_mean"] = 1.0 if name == "gemma2" else 0.3
    return tiny(**spec)


def _ids(n: int, seed: int = 5) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(0, 49152, n)]


def kiln_rope(path, g, layer: int, x: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """x rotated by layer's rope as kiln's graph g for this model runs it: the rotation the rope table
    holds for the layer (its base, dims, factors from the file, the scaling as codegen/emit.py hands
    it to C), made by kiln_rope_angles as the head's kiln_rope_table does, then kiln_rope_rotate."""
    K = runtime_kernels()
    table = table_node(g)
    node = next(n for n in g.body if n.name == "q_rope")
    k = table.attrs.layers[layer]
    rot, a = table.attrs.rotations[k], table.attrs.scaling
    rows, heads, d = x.shape
    fields = ("freq_scale", "ext_factor", "mscale", "beta_fast", "beta_slow", "n_ctx_orig")
    sc = K.ffi.new("kiln_rope_scaling *", {f: getattr(a, f) for f in fields}) if rope_scaled(table.attrs) \
        else K.ffi.NULL
    factors = np.fromfile(path, np.float32, rot.n_rot // 2, offset=table.inputs[1].tensor.offset) if rot.factors \
        else None
    cs = np.zeros((rows, rot.n_rot), np.float32)
    K.lib.kiln_rope_angles(K.ffi.cast("float *", cs.ctypes.data), rot.n_rot, K.ffi.cast("int32_t *", pos.ctypes.data),
                           rows, rot.n_rot, rot.base, sc,
                           K.ffi.NULL if factors is None else K.ffi.cast("float *", factors.ctypes.data))
    y = np.zeros_like(x)
    K.lib.kiln_rope_rotate(K.ffi.cast("float *", y.ctypes.data), K.ffi.cast("float *", x.ctypes.data),
                           K.ffi.cast("float *", cs.ctypes.data), rot.n_rot, rows, heads, d, node.attrs.n_rot,
                           int(node.attrs.layout.value == "neox"))
    return y


@pytest.mark.parametrize("name", list(MODELS))
def test_each_rope_is_ggmls_with_llamacpps_own_parameters(tiny, smollm2, name):
    """Each layer's rope: kiln's kernel with the parameters kiln derives, against ggml_rope_ext with
    the ones llama.cpp's graph holds (its attention factor, YaRN's, the factors it chose), on the
    same rows at positions 0 to 4095: the same bits."""
    path = feature_model(tiny, smollm2, name, Q.F32)
    ropes, g = llamacpp_ropes(path, n_ctx=128), plan(path, CompileOptions(ctx=128)).graph
    assert sorted(ropes) == [ly.index for ly in g.layers if ly.rope_base], "a rope where llama.cpp has none, or none where it has one"
    pos = np.concatenate([np.arange(80), [97, 128, 200, 511, 1000, 4095]]).astype(np.int32)
    for layer, (params, factors) in sorted(ropes.items()):
        d = params["n_dims"]
        x = np.random.default_rng(layer).standard_normal((len(pos), 3, d)).astype(np.float32)
        got = kiln_rope(path, g, layer, x, pos)
        want = rope(x, pos, params, factors)
        differ = np.argwhere(got != want)
        assert not len(differ), (f"layer {layer} ({'neox' if params['mode'] == ROPE_NEOX else 'pairwise'}, "
                                 f"llama.cpp's {params}): {len(differ)} of {got.size} values differ, first at "
                                 f"[position {pos[differ[0][0]]}, head, dim] {differ[0]}: {got[tuple(differ[0])]!r} "
                                 f"against ggml's {want[tuple(differ[0])]!r}")


@pytest.mark.parametrize("name", list(CONTROL) + FEATURES)
def test_f32_logits_meet_llamacpp_at_the_floor_and_miss_it_without_the_feature(tiny, smollm2, name):
    path = feature_model(tiny, smollm2, name, Q.F32, raised=True)
    ids = _ids(70)
    ref = Reference(path, n_ctx=128).logits(ids)
    a = compare(ref, compiler.load(path, ctx=128, prefill_chunk=16).prefill(ids, logits="all"))
    print(f"\n{name} F32: mean KL {a.mean_kl:.2e}, top-1 {a.top1:.1%}, max|d| {a.max_abs:.2e}")
    assert a.mean_kl <= FLOOR and a.top1 == 1.0, f"{name}: mean KL {a.mean_kl:.2e} from llama.cpp, above {FLOOR:g}"
    if name in FEATURE_OFF:
        off = feature_model(tiny, smollm2, name, Q.F32, raised=True, off=True)
        b = compare(ref, compiler.load(off, ctx=128, prefill_chunk=16).prefill(ids, logits="all"))
        print(f"{name} without its feature: mean KL {b.mean_kl:.2e}, top-1 {b.top1:.1%}")
        assert b.mean_kl >= MISSES, f"{name}: switched off, the model still lands {b.mean_kl:.2e} from llama.cpp"


@pytest.mark.parametrize("name", FEATURES)
def test_q8_0_logits_match_llamacpp(tiny, smollm2, name):
    path = feature_model(tiny, smollm2, name)
    a = compare(Reference(path, n_ctx=128).logits(_ids(70)),
                compiler.load(path, ctx=128, prefill_chunk=16).prefill(_ids(70), logits="all"))
    print(f"\n{name} Q8_0: mean KL {a.mean_kl:.2e}, top-1 {a.top1:.1%}, max|d| {a.max_abs:.4f}")
    # measured 3e-15 to 2.2e-7: where an activation rounds to the other 8-bit step (the module's
    # docstring), the logits move by up to 2e-7 on these models (norms near 0)
    assert a.mean_kl <= 1e-6 and a.top1 >= 0.97


@pytest.mark.parametrize("name", FEATURES)
def test_greedy_tokens_match_llamacpp(tiny, smollm2, name):
    path = feature_model(tiny, smollm2, name, Q.F32, raised=True)
    ref, kiln = Reference(path, n_ctx=128), compiler.load(path, ctx=128, prefill_chunk=16)
    ids = ref.tokenize("Once upon a time, in a small village at the edge of a forest,")
    assert kiln_greedy(kiln, ids, 32) == ref.greedy(ids, 32)


@pytest.mark.parametrize("name", ["llama-rope-freqs", "llama-linear"])
def test_a_context_shift_rotates_with_the_factors_and_scale(tiny, smollm2, name):
    """kiln re-rotates kept keys with the layer's frequency factors and scaling, as llama.cpp's
    shift does (compared where llama.cpp's shift keeps the keys' magnitude: no attention factor).
    Not SmolLM3: kiln leaves a NoPE layer's keys as they are, since they hold no position, where
    llama.cpp's shift rotates every layer's (its hparams.has_rope is true but for granite's router
    layer), measured 2.2e-4 apart after this shift."""
    path = feature_model(tiny, smollm2, name, Q.F32, raised=True)
    ref, kiln = Reference(path, n_ctx=128), compiler.load(path, ctx=128, prefill_chunk=16)
    ids = _ids(110, seed=7)
    ref.reset()
    ref.feed(ids[:80])
    ref.shift(4, 40)
    kiln.reset()
    kiln.prefill(ids[:80])
    assert kiln.default_sequence.shift(4, 40) == 40
    a = compare(ref.extend(ids[80:110]), kiln.prefill(ids[80:110], logits="all"))
    print(f"\n{name} after a shift: mean KL {a.mean_kl:.2e}, top-1 {a.top1:.1%}")
    assert a.mean_kl <= FLOOR and a.top1 == 1.0


def test_the_reference_holds_kilns_cache_dtype_unless_told(tiny, smollm2):
    """Reference(path) keeps its cache in kiln's default dtype (f32): its logits are those of an
    f32 cache, bit for bit, and not an f16 cache's."""
    path = feature_model(tiny, smollm2, "control", Q.F32, raised=True)
    ids = _ids(40)
    default = Reference(path, n_ctx=64).logits(ids)
    assert CompileOptions.kv_dtype.label == "f32"
    np.testing.assert_array_equal(default, Reference(path, n_ctx=64, kv_dtype="f32").logits(ids),
                                  err_msg="Reference(path) does not hold an f32 cache")
    assert not np.array_equal(default, Reference(path, n_ctx=64, kv_dtype="f16").logits(ids)), "f16 gives the same"
