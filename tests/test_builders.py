"""The graph builder: the step graph follows the architecture, stage by stage, with one body for every layer."""
from __future__ import annotations

import re
from collections import Counter

import pytest

from compiler.frontend.architecture import LayerKind, RopeLayout, load_architecture
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
