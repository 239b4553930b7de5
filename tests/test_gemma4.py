"""Gemma 4 (templates/gemma4.json) against llama.cpp, on synthetic GGUFs written from llama.cpp's own
loader (compiler/tools/synthetic_gemma4.py): six layers, sliding (2 KV heads of 32, their own rope
base) and global (1 KV head of 64, the proportional rope's factors, K's projection as V) as the file's
sliding_window_pattern says (S S F S S F); the last three keep no KV and read layer 1's (sliding)
and layer 2's (global); per-layer embeddings; each layer's output scale; the final soft-cap.

The floor. This model is sharper than the others (attention unscaled, as Gemma 4's q and k norms
leave it): llama.cpp's own batched and token-by-token runs of it differ by a mean KL of 7.8e-10
(6.2e-9 with its norms 0.3 higher), and kiln lands at 7.3e-10 from llama.cpp, under the 1e-9
every architecture is held to. Each feature switched off misses by orders of magnitude: in the
file (the per-layer embeddings' table and projection zeroed, each output scale 1, the rope's
factors 1, the window past the sequence, the soft-cap 0), in the template (V not normed), or in
the planner (a layer that keeps no KV reading the first layer of its kind rather than the last).
"""
from __future__ import annotations

import json
import re

import pytest
from gguf import GGMLQuantizationType as Q

import compiler
import compiler.frontend.architecture_file as architecture_file
from compiler.core.errors import ModelFileError
from compiler.core.options import CompileOptions
from compiler.ir.emitter import GraphBuilder
from compiler.planner.plan import plan
from compiler.planner.reports.html import render_html
from compiler.planner.reports.text import layout_dict, render_text
from reference import Reference, compare, kiln_greedy
from test_archs import FLOOR, MISSES, _ids
from test_batch import assert_batch_invariant

GEMMA4 = dict(arch="gemma4", n_layer=6, n_embd=128, n_head=4, n_head_kv=2, n_ff=256, head_dim=32, sliding_window=8,
              full_attention_interval=3, norm_mean=-0.3, untied=True)
OFF_IN_THE_FILE = {
    "per-layer embeddings": dict(fill={"per_layer_token_embd.weight": (0.0,), "per_layer_model_proj.weight": (0.0,)}),
    "output scale": dict(fill={"layer_output_scale.weight": (1.0,)}),
    "proportional rope": dict(fill={"rope_freqs.weight": (1.0,)}),
    "window": dict(sliding_window=128),
    "final soft-cap": dict(extra_meta={"final_logit_softcapping": 0.0}),
}


@pytest.fixture(scope="module")
def gemma4(tiny, smollm2):
    def make(wtype=Q.F32, **more):
        return tiny(**(dict(GEMMA4, wtype=wtype, tokenizer_from=smollm2) | more))
    return make


def _kiln(path, **kw):
    return compiler.load(path, ctx=128, prefill_chunk=16, **kw)


@pytest.mark.llamacpp
def test_f32_logits_meet_llamacpp_at_the_floor(gemma4):
    path, ids = gemma4(), _ids(40)
    a = compare(Reference(path, n_ctx=128).logits(ids), _kiln(path).prefill(ids, logits="all"))
    print(f"\ngemma4 F32: mean KL {a.mean_kl:.2e}, top-1 {a.top1:.1%}, max|d| {a.max_abs:.2e}")
    assert a.mean_kl <= FLOOR and a.top1 == 1.0, a


@pytest.mark.llamacpp
def test_q8_0_logits_match_llamacpp_but_for_a_rounding_flip(gemma4):
    """Q8_0 weights: both engines quantize each activation to 8 bits before a matmul, and where a
    value is an ulp apart it now and then rounds to the other step (tests/test_archs.py says more);
    this sharp model carries such a step far. Measured: 39 of 40 positions at 1e-12, one at 2.7e-4
    (mean 6.7e-6); llama.cpp's own batched and token-by-token runs of it agree exactly."""
    path, ids = gemma4(Q.Q8_0), _ids(40)
    ref, got = Reference(path, n_ctx=128).logits(ids), _kiln(path).prefill(ids, logits="all")
    per = [compare(ref[i:i + 1], got[i:i + 1]).mean_kl for i in range(len(ids))]
    flips = [kl for kl in per if kl > FLOOR]
    print(f"\ngemma4 Q8_0: median KL {sorted(per)[len(per) // 2]:.2e}, flips {['%.1e' % f for f in flips]}")
    assert sorted(per)[len(per) // 2] <= FLOOR and len(flips) <= 2 and max(flips, default=0) < 1e-3
    assert compare(ref, got).top1 == 1.0


@pytest.mark.llamacpp
def test_greedy_tokens_match_llamacpp(gemma4):
    path = gemma4()
    ref = Reference(path, n_ctx=128)
    ids = ref.tokenize("Once upon a time, in a small village at the edge of a forest,")
    assert kiln_greedy(_kiln(path), ids, 32) == ref.greedy(ids, 32)


@pytest.mark.llamacpp
@pytest.mark.parametrize("feature", list(OFF_IN_THE_FILE))
def test_each_feature_of_the_file_switched_off_misses_llamacpp(gemma4, feature):
    ids = _ids(40)
    ref = Reference(gemma4(), n_ctx=128).logits(ids)
    b = compare(ref, _kiln(gemma4(**OFF_IN_THE_FILE[feature])).prefill(ids, logits="all"))
    print(f"\ngemma4 without its {feature}: mean KL {b.mean_kl:.2e}, top-1 {b.top1:.1%}")
    assert b.mean_kl >= MISSES, b


@pytest.mark.llamacpp
def test_v_not_normed_misses_llamacpp(gemma4, tmp_path, monkeypatch):
    import shutil

    path, ids = gemma4(), _ids(40)
    ref = Reference(path, n_ctx=128).logits(ids)
    shutil.copytree(architecture_file.ARCH_DIR, tmp_path / "templates")
    template = json.loads((tmp_path / "templates" / "gemma4.json").read_text())
    (tmp_path / "templates" / "gemma4.json").write_text(json.dumps(template | {"v_norm": False}))
    monkeypatch.setattr(architecture_file, "ARCH_DIR", tmp_path / "templates")
    b = compare(ref, _kiln(path).prefill(ids, logits="all"))
    print(f"\ngemma4 with V not normed: mean KL {b.mean_kl:.2e}")
    assert b.mean_kl >= MISSES, b


@pytest.mark.llamacpp
def test_reading_another_layers_kv_misses_llamacpp(gemma4, monkeypatch):
    """A layer that keeps no KV must read the last earlier layer of its kind (llama.cpp's reuse):
    the first one of its kind instead lands far away."""
    path, ids = gemma4(), _ids(40)
    ref = Reference(path, n_ctx=128).logits(ids)
    rule = GraphBuilder._kv_source

    def first_of_kind(self, il):
        src = rule(self, il)
        return src if src == il else self.kinds.index(self.kinds[il])
    monkeypatch.setattr(GraphBuilder, "_kv_source", first_of_kind)
    b = compare(ref, _kiln(path).prefill(ids, logits="all"))
    print(f"\ngemma4 reading the first layer of each kind: mean KL {b.mean_kl:.2e}")
    assert b.mean_kl >= MISSES, b


def test_the_plan_shares_pages_and_sizes_each_group(gemma4):
    """The shared layers own no bytes of a page: they read their source's rows at its offsets; each
    group's page holds its layers' own widths, and the map says who reads whose pages."""
    p = plan(gemma4(), CompileOptions(ctx=256))
    kv = p.layout.kv
    src = {ly.layer: ly.source for ly in kv.layers if ly.shared}
    assert src == {3: 1, 4: 1, 5: 2}
    for il, s in src.items():
        ly, owner = kv.of(il), kv.of(s)
        assert (ly.group, ly.offset, ly.v_offset, ly.page_bytes) == (owner.group, owner.offset, owner.v_offset, 0)
    full, local = kv.groups
    assert full.layers == (2,) and local.layers == (0, 1) and local.window == 8
    assert full.page_bytes == 2 * 1 * 64 * 64 * 4 and local.page_bytes == 2 * (2 * 2 * 64 * 32 * 4)
    assert kv.shared_saved_bytes == 2 * local.n_pages * (local.page_bytes // 2) + full.n_pages * full.page_bytes
    d = layout_dict(p.layout)
    assert d["totals"]["kv_bytes_saved_by_sharing"] == kv.shared_saved_bytes
    assert [e.get("reads_layer") for e in d["kv"]] == [None, None, None, 1, 1, 2]
    assert [(e["n_head_kv"], e["head_dim"]) for e in d["kv"]] == [(2, 32), (2, 32), (1, 64)] * 2
    assert "reads layer 1's rows" in render_text(p.layout)
    assert "also read by layers 3, 4" in render_html(p.layout)


def test_batch_chunk_and_thread_invariance_is_bitwise(gemma4):
    """Each layer that reads another's KV reads rows that layer wrote earlier in the same step."""
    path = gemma4(Q.Q8_0)
    for kv_dtype in ("f32", "q8_0"):
        assert_batch_invariant(compiler.load(path, ctx=256, n_seq=4, kv_dtype=kv_dtype, prefill_chunk=16,
                                             batch_tokens=24, page_size=8), n=120)



# The 26B-A4B's shape: every layer routes 2 of 4 GeGLU experts (gate and up in one tensor) beside its
# dense FFN; no per-layer embeddings, no shared KV (as that model)
MOE = dict(n_expert=4, n_expert_used=2, extra_meta={"expert_feed_forward_length": 64})
MOE_OFF = {"router scale": dict(fill={"ffn_gate_inp.scale": (1.0,)}),
           "expert scale": dict(fill={"ffn_down_exps.scale": (1.0,)}),
           "shared MLP's norm": dict(fill={"post_ffw_norm_1.weight": (1.0,)})}


@pytest.mark.llamacpp
@pytest.mark.parametrize("wtype, split", [(Q.F32, False), (Q.Q8_0, False), (Q.F32, True)],
                         ids=["f32", "q8_0", "f32-gate-and-up-apart"])
def test_moe_logits_meet_llamacpp_at_the_floor(gemma4, wtype, split):
    """Measured 7.2e-12 (F32), 9.0e-13 (Q8_0), 2.0e-11 (gate and up as two tensors)."""
    meta = MOE["extra_meta"] | ({"synthetic.fused_gate_up": False} if split else {})
    path, ids = gemma4(wtype, **(MOE | {"extra_meta": meta})), _ids(40)
    a = compare(Reference(path, n_ctx=128).logits(ids), _kiln(path).prefill(ids, logits="all"))
    print(f"\ngemma4 MoE {wtype.name}{' split' if split else ''}: mean KL {a.mean_kl:.2e}, top-1 {a.top1:.1%}")
    assert a.mean_kl <= FLOOR and a.top1 == 1.0, a


@pytest.mark.llamacpp
@pytest.mark.parametrize("feature", list(MOE_OFF))
def test_moe_features_switched_off_miss_llamacpp(gemma4, feature):
    ids = _ids(40)
    ref = Reference(gemma4(**MOE), n_ctx=128).logits(ids)
    b = compare(ref, _kiln(gemma4(**MOE, **MOE_OFF[feature])).prefill(ids, logits="all"))
    print(f"\ngemma4 MoE without its {feature}: mean KL {b.mean_kl:.2e}")
    assert b.mean_kl >= MISSES, b


def test_moe_batch_invariance_is_bitwise(gemma4):
    assert_batch_invariant(compiler.load(gemma4(Q.Q8_0, **MOE), ctx=256, n_seq=4, prefill_chunk=16, batch_tokens=24,
                                         page_size=8), n=120)


@pytest.mark.llamacpp
def test_moe_greedy_tokens_match_llamacpp(gemma4):
    path = gemma4(**MOE)
    ref = Reference(path, n_ctx=128)
    ids = ref.tokenize("Once upon a time, in a small village at the edge of a forest,")
    assert kiln_greedy(_kiln(path), ids, 32) == ref.greedy(ids, 32)


@pytest.mark.parametrize("more, words", [
    (dict(shapes={"per_layer_model_proj.weight": (6 * 32, 64)}),
     "tensor 'per_layer_model_proj.weight' is [192, 64] but 6 layers' per-layer embeddings of 32"),
    (dict(shapes={f"blk.{il}.layer_output_scale.weight": (2,) for il in range(6)}),
     "'blk.0.layer_output_scale.weight' is F32 [2]; a layer's output scale is one F32"),
    (dict(drop=("rope_freqs.weight",)), "tensor 'rope_freqs.weight' is missing"),
])
def test_a_broken_gemma4_file_is_refused_by_name(gemma4, more, words):
    with pytest.raises(ModelFileError, match=re.escape(words)):
        plan(gemma4(**more), CompileOptions(ctx=64))
