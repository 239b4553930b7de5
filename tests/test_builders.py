"""The graph builder: the step graph follows the architecture, stage by stage, with one body for every layer."""
from __future__ import annotations

import re
from collections import Counter

import numpy as np
import pytest

from compiler.frontend.architecture import LayerKind, RopeLayout
from compiler.frontend.architecture_file import load_architecture
from compiler.frontend.gguf_reader import read_model
from compiler.ir.builder import build_graph
from compiler.ir.graph import AttentionAttrs, EmbedAttrs, Op, RopeAttrs, ValueKind
from compiler.ir.printer import format_graph


def _graph(path, rows=8):
    spec = read_model(path)
    return spec, build_graph(spec, load_architecture(spec.arch), rows)


def test_llama_step_structure(tiny):
    spec, g = _graph(tiny("llama"))
    ops = Counter(n.op for n in g.body)
    assert ops[Op.MATMUL] == 7 and ops[Op.RMS_NORM] == 2 and ops[Op.ROPE] == 2 and ops[Op.ATTENTION] == 1
    assert [n.name for n in g.head] == ["inp_embd"]
    assert [n.name for n in g.body] == ["attn_norm", "q", "k", "v", "q_rope", "k_rope", "attn", "attn_out", "ffn_inp",
                                        "ffn_norm", "ffn_gate", "ffn_up", "ffn_glu", "ffn_out", "l_out"]
    assert [n.name for n in g.tail] == ["result_norm", "result_rows", "result_output"]
    assert g.outputs[0].shape == (8, spec.hparams.n_vocab) and g.outputs[0].kind is ValueKind.OUTPUT  # caller memory
    assert [ly.index for ly in g.layers] == [0, 1]
    assert g.layers[1].weights["attn_q"].name == "blk.1.attn_q.weight"


def test_the_residual_stream_is_state_every_layer_adds_into(tiny):
    _, g = _graph(tiny("qwen3"))
    (x,) = g.state
    assert x.kind is ValueKind.STATE and x.shape == (8, 64)
    assert g.head[0].outputs == (x,)  # the embedding writes it
    adds = [n for n in g.body if n.op is Op.ADD]
    assert [n.name for n in adds] == ["ffn_inp", "l_out"] and all(n.outputs == (x,) and n.inputs[1] == x for n in adds)
    assert g.tail[0].inputs[0] == x


def test_qwen2_bias_and_untied_head(tiny):
    spec, g = _graph(tiny("qwen2"))
    q = next(n for n in g.body if n.name == "q")
    assert [v.name for v in q.inputs[1:]] == ["attn_q", "attn_q_bias"]
    assert g.layers[0].weights["attn_q_bias"].name == "blk.0.attn_q.bias"
    head = g.tail[-1].inputs[1]
    assert head.name == "output.weight" and head.tensor.name == "output.weight"


def test_tied_head_is_a_view_of_the_embedding(smollm2):
    _, g = _graph(smollm2)
    head = g.tail[-1].inputs[1]
    assert head.name == "output.weight" and head.tensor.name == "token_embd.weight"


def test_gemma3_layers(gemma3):
    spec, g = _graph(gemma3)
    (attn,) = [n.attrs for n in g.body if n.op is Op.ATTENTION]
    rope = next(n.attrs for n in g.body if n.name == "q_rope")
    assert isinstance(attn, AttentionAttrs) and isinstance(rope, RopeAttrs) and rope.layout is RopeLayout.NEOX
    for ly in g.layers:  # what differs between layers is data: kind, window, rope base
        glob = ly.index in (5, 11, 17)
        assert ly.kind is (LayerKind.GLOBAL if glob else LayerKind.LOCAL)
        assert ly.window == (None if glob else 512)
        assert ly.rope_base == (1_000_000.0 if glob else 10000.0)
    embed = g.head[0].attrs
    assert isinstance(embed, EmbedAttrs) and embed.scale == pytest.approx(640 ** 0.5)
    names = [n.name for n in g.body]
    assert names.index("attn_post_norm") < names.index("ffn_inp")
    assert names.index("ffn_post_norm") < names.index("l_out")
    assert names.index("q_norm") < names.index("q_rope")


def test_missing_tensor_names_it(tiny):
    spec = read_model(tiny("llama", drop=("blk.1.ffn_up.weight",)))
    with pytest.raises(Exception, match=r"tensor 'blk\.1\.ffn_up\.weight' is missing"):
        build_graph(spec, load_architecture("llama"), 8)


def test_format_graph_is_greppable(tiny):
    _, g = _graph(tiny("llama"))
    text = format_graph(g)
    assert re.search(r"attn_norm +rms_norm", text) and "body, for each layer 0..1" in text
    assert text.count("\n") == len(g.nodes) + 4 + 3 + 1 + len(g.layers)  # header, sections, layers
    assert re.search(r"\n +1 +global window - +rope base 10000 +attn_norm f32, attn_q f32", text)


# -- the architectures beyond the plain blocks (their parity with llama.cpp: tests/test_archs.py) --------------
def test_phi3_reads_q_k_v_and_gate_up_as_row_ranges_of_its_fused_tensors(tiny):
    spec, g = _graph(tiny("phi3", n_embd=128, n_head=4, n_head_kv=2, n_ff=256))
    qkv, up = spec.tensor("blk.1.attn_qkv.weight"), spec.tensor("blk.1.ffn_up.weight")
    assert qkv.shape == (256, 128) and up.shape == (512, 128)
    w, row = g.layers[1].weights, qkv.nbytes // 256
    for role, first, count in (("attn_q", 0, 128), ("attn_k", 128, 64), ("attn_v", 192, 64)):
        t = w[role]
        assert (t.view_of, t.offset, t.shape, t.nbytes) == (qkv.name, qkv.offset + first * row, (count, 128), count * row)
        assert t.name == f"blk.1.attn_qkv.weight[{first}:{first + count}]"
    assert w["ffn_gate"].offset == up.offset and w["ffn_up"].offset == up.offset + 256 * (up.nbytes // 512)
    assert [n.name for n in g.body][:7] == ["attn_norm", "q", "k", "v", "q_rope", "k_rope", "attn"]  # llama's body


def test_a_fused_tensor_must_hold_exactly_its_parts(tiny):
    spec = read_model(tiny("phi3", shapes={f"blk.{i}.attn_qkv.weight": (120, 64) for i in range(2)}))
    with pytest.raises(Exception, match=r"tensor 'blk\.0\.attn_qkv\.weight' has 120 rows; the phi3 architecture "
                                        r"reads it as attn_q \(64\) \+ attn_k \(32\) \+ attn_v \(32\)"):
        build_graph(spec, load_architecture("phi3"), 8)


def test_granite_takes_its_four_scalars_from_the_file(tiny):
    meta = {"embedding_scale": 12.0, "residual_scale": 0.22, "attention.scale": 0.0078125, "logit_scale": 8.0}
    _, g = _graph(tiny("granite", extra_meta=meta))
    nodes = {n.name: n for n in g.nodes}
    assert nodes["inp_embd"].attrs.scale == 12.0 and nodes["attn"].attrs.scale == 0.0078125
    for scaled, add in (("attn_scaled", "ffn_inp"), ("ffn_scaled", "l_out")):  # each branch, before its add
        assert nodes[scaled].op is Op.SCALE and nodes[scaled].attrs.scale == pytest.approx(0.22)
        assert nodes[add].inputs[0] == nodes[scaled].outputs[0]
    result = nodes["result_scaled"]  # llama.cpp multiplies by the float 1/8
    assert result.op is Op.SCALE and result.inputs == result.outputs == g.outputs and result.attrs.scale == 0.125
    # without attention.scale, 1/sqrt(head_dim); without logit_scale, refused (llama.cpp requires it)
    _, plain = _graph(tiny("granite", extra_meta={"logit_scale": 8.0}))
    assert next(n for n in plain.body if n.op is Op.ATTENTION).attrs.scale == pytest.approx(16 ** -0.5)
    assert not any(n.op is Op.SCALE for n in plain.body) and plain.head[0].attrs.scale == 1.0
    with pytest.raises(Exception, match=r"'granite\.logit_scale' is missing or 0"):
        read_model(tiny("granite"))


def test_gemma2_caps_and_scale(tiny):
    _, g = _graph(tiny("gemma2", n_layer=4, extra_meta={"attn_logit_softcapping": 5.0, "final_logit_softcapping": 20.0}))
    attn = next(n for n in g.body if n.op is Op.ATTENTION).attrs
    assert attn.softcap == 5.0 and attn.scale == pytest.approx(16 ** -0.5)
    assert g.tail[-1].name == "result_capped" and g.tail[-1].attrs.cap == 20.0 and g.tail[-1].outputs == g.outputs
    assert [ly.kind for ly in g.layers] == [LayerKind.LOCAL, LayerKind.GLOBAL] * 2
    assert {ly.rope_base for ly in g.layers} == {1_000_000.0}  # local layers: the file's base, as llama.cpp
    _, defaults = _graph(tiny("gemma2", n_layer=4))  # Gemma 2's own caps where the file has none
    assert next(n for n in defaults.body if n.op is Op.ATTENTION).attrs.softcap == 50.0
    assert defaults.tail[-1].attrs.cap == 30.0
    # the 27B (46 layers): 1/sqrt(query_pre_attn_scalar) = 1/sqrt(n_embd / n_head), not 1/sqrt(head_dim)
    _, big = _graph(tiny("gemma2", n_layer=46, n_embd=64, n_head=2, n_head_kv=1, head_dim=16, n_ff=32))
    assert next(n for n in big.body if n.op is Op.ATTENTION).attrs.scale == pytest.approx(32 ** -0.5)


def test_rope_scaling_and_factors_become_the_ropes_parameters(tiny):
    from compiler.tools.synthetic_features import FEATURE_MODELS, FEATURE_SHAPE

    def model(name):
        return tiny(**dict(FEATURE_SHAPE, **FEATURE_MODELS[name]))
    _, g = _graph(model("qwen2-yarn"))
    rope = next(n for n in g.body if n.name == "k_rope")
    a = rope.attrs  # llama.cpp's: the attention factor cancels YaRN's, which ggml's rope_yarn puts back
    assert (a.freq_scale, a.ext_factor, a.n_ctx_orig, a.beta_fast, a.beta_slow) == (0.25, 1.0, 32, 32.0, 1.0)
    assert a.mscale == pytest.approx(1 + 0.1 * np.log(4), rel=1e-6) and len(rope.inputs) == 2
    _, freqs = _graph(model("llama-rope-freqs"))
    q_rope = next(n for n in freqs.body if n.name == "q_rope")
    assert not q_rope.attrs.scaled and [v.name for v in q_rope.inputs] == ["q", "inp_pos", "rope_factors_q"]
    assert {ly.weights["rope_factors_q"].name for ly in freqs.layers} == {"rope_freqs.weight"}  # one for all layers
    # LongRoPE: the long factors once the context exceeds the original 64, the short ones within it
    phi3 = read_model(model("phi3-long"))
    for n_ctx, chosen, other in ((128, "rope_factors_long.weight", "rope_factors_short.weight"),
                                 (64, "rope_factors_short.weight", "rope_factors_long.weight")):
        g = build_graph(phi3, load_architecture("phi3"), 8, n_ctx)
        assert g.layers[0].weights["rope_factors_k"].name == chosen and g.unused == (other,)
        assert next(n for n in g.body if n.name == "q_rope").attrs.mscale == pytest.approx(1.19)
