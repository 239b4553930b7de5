"""Graph builders: the decode and prefill graphs follow the template, stage by stage, layer by layer."""
from __future__ import annotations

import re
from collections import Counter

import pytest

from compiler.ir.builder import build_decode, build_prefill
from compiler.frontend.gguf_reader import read_model
from compiler.ir.graph import AttentionAttrs, EmbedAttrs, Mode, Op, RopeAttrs, ValueKind, format_graph
from compiler.frontend.architecture import LayerKind, RopeLayout, load_architecture


def _graphs(path, chunk=8):
    spec = read_model(path)
    arch = load_architecture(spec.arch)
    return spec, build_decode(spec, arch), build_prefill(spec, arch, chunk)


def test_llama_block_structure(tiny):
    spec, dec, pre = _graphs(tiny("llama"))
    ops = Counter(n.op for n in dec.nodes)
    assert ops[Op.MATMUL] == 2 * 7 and ops[Op.LOGITS] == 1 and ops[Op.RMS_NORM] == 2 * 2 + 1 and ops[Op.ROPE] == 4
    assert ops[Op.ATTENTION] == 2 and ops[Op.GLU] == 2 and ops[Op.EMBED] == 1
    assert [n.label for n in dec.nodes[:12]] == [
        "inp_embd", "attn_norm-0", "q-0", "k-0", "v-0", "q_rope-0", "k_rope-0", "attn-0", "attn_out-0",
        "ffn_inp-0", "ffn_norm-0", "ffn_gate-0"]
    assert dec.nodes[-1].label == "result_output" and dec.outputs[0].shape == (1, spec.hparams.n_vocab)
    assert all(n.layer is None or 0 <= n.layer < 2 for n in dec.nodes)


def test_modes_differ_only_in_tokens_and_last_row(tiny):
    _, dec, pre = _graphs(tiny("qwen3"), chunk=8)
    assert (dec.mode, dec.n_tokens, pre.mode, pre.n_tokens) == (Mode.DECODE, 1, Mode.PREFILL, 8)
    assert [n.op for n in pre.nodes] == [n.op for n in dec.nodes]
    assert [n.label for n in pre.nodes] == [n.label for n in dec.nodes]
    head = pre.nodes[-1]
    assert head.op is Op.LOGITS and head.inputs[0].shape == (8, 64)
    assert pre.outputs == head.outputs and pre.outputs[0].kind is ValueKind.OUTPUT  # caller memory, not arena
    assert pre.outputs[0].shape == (8, 259) and dec.outputs[0].shape == (1, 259)


def test_qwen2_bias_and_untied_head(tiny):
    spec, dec, _ = _graphs(tiny("qwen2"))
    q = next(n for n in dec.nodes if n.label == "q-0")
    assert [v.name for v in q.inputs[1:]] == ["blk.0.attn_q.weight", "blk.0.attn_q.bias"]
    head = dec.nodes[-1].inputs[1]
    assert head.name == "output.weight" and head.tensor.name == "output.weight"


def test_tied_head_is_a_view_of_the_embedding(smollm2):
    _, dec, _ = _graphs(smollm2)
    head = dec.nodes[-1].inputs[1]
    assert head.name == "output.weight" and head.tensor.name == "token_embd.weight"


def test_gemma3_attrs(gemma3):
    spec, dec, _ = _graphs(gemma3)
    attn = {n.layer: n.attrs for n in dec.nodes if n.op is Op.ATTENTION}
    rope = {n.layer: n.attrs for n in dec.nodes if n.label.startswith("q_rope")}
    assert all(isinstance(a, AttentionAttrs) and isinstance(r, RopeAttrs) for a, r in zip(attn.values(), rope.values()))
    for il in range(18):
        glob = il in (5, 11, 17)
        assert attn[il].kind is (LayerKind.GLOBAL if glob else LayerKind.LOCAL)
        assert attn[il].window == (None if glob else 512)
        assert rope[il].base == (1_000_000.0 if glob else 10000.0)
        assert rope[il].layout is RopeLayout.NEOX
    embed = dec.nodes[0].attrs
    assert isinstance(embed, EmbedAttrs) and embed.scale == pytest.approx(640 ** 0.5)
    labels = [n.label for n in dec.nodes if n.layer == 0]
    assert labels.index("attn_post_norm-0") < labels.index("ffn_inp-0")
    assert labels.index("ffn_post_norm-0") < labels.index("l_out-0")
    assert labels.index("q_norm-0") < labels.index("q_rope-0")


def test_missing_tensor_names_it(tiny):
    spec = read_model(tiny("llama", drop=("blk.1.ffn_up.weight",)))
    with pytest.raises(Exception, match=r"tensor 'blk\.1\.ffn_up\.weight' is missing"):
        build_decode(spec, load_architecture("llama"))


def test_format_graph_is_greppable(tiny):
    _, dec, _ = _graphs(tiny("llama"))
    text = format_graph(dec)
    assert re.search(r"attn_norm-1 +rms_norm", text) and text.count("\n") == len(dec.nodes) + 3
