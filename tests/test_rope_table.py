"""The rope_table pass (compiler/passes/rope_table.py), checked before and after it runs: one head
node makes each distinct rotation of the layers once a step, and every rope reads its layer's.
That the rotations it makes are ggml's, bit for bit, is test_archs.py's
test_each_rope_is_ggmls_with_llamacpps_own_parameters (which runs the table's kernels)."""
from __future__ import annotations

from bert_synthetic import write_bert
from compiler.frontend.architecture_file import load_architecture
from compiler.frontend.gguf_reader import read_model
from compiler.ir.builder import build_graph
from compiler.ir.graph import Op, ValueKind
from compiler.passes.rope_table import TABLE, rope_table, table_node
from compiler.passes.validate import graph_problems
from compiler.tools.synthetic_features import FEATURE_MODELS, FEATURE_SHAPE


def _built(path):
    spec = read_model(path)
    return spec, build_graph(spec, load_architecture(spec.arch), 8)


def _ropes(g):
    return [n for n in g.body_nodes if n.op is Op.ROPE]


def test_one_rotation_for_every_layer_of_a_llama(tiny):
    spec, g = _built(tiny("llama"))
    assert table_node(g) is None and all(n.inputs[1].name == "inp_pos" for n in _ropes(g))
    after = rope_table(g)
    table = table_node(after)
    assert after.head[:-1] == g.head and after.head[-1] is table and after.tail == g.tail
    assert [v.name for v in table.inputs] == ["inp_pos"] and table.outputs[0] in after.state
    (rot,) = table.attrs.rotations
    assert (rot.base, rot.n_rot, rot.factors, rot.at) == (g.layers[0].rope_base, 16, False, 0)
    assert table.outputs[0].shape == (8, 16) and table.attrs.layers == (0,) * len(g.layers)
    assert all([v.name for v in n.inputs] == [n.inputs[0].name, TABLE] for n in _ropes(after))
    assert graph_problems(g, spec) == graph_problems(after, spec) == []


def test_gemma3s_local_and_global_layers_take_their_own_base(tiny):
    """Gemma 3's sliding layers rotate by base 10000, its global ones by the file's: two rotations side
    by side, each layer pointing at its own."""
    spec, g = _built(tiny("gemma3", n_layer=6))
    table = table_node(rope_table(g))
    bases = [r.base for r in table.attrs.rotations]
    assert len(set(bases)) == 2 and [r.at for r in table.attrs.rotations] == [0, 16]
    assert [bases[k] for k in table.attrs.layers] == [ly.rope_base for ly in g.layers]
    assert graph_problems(rope_table(g), spec) == []


def test_the_frequency_factors_move_from_the_layers_to_the_table(tiny):
    path = tiny(**dict(FEATURE_SHAPE, **FEATURE_MODELS["llama-rope-freqs"]))
    spec, g = _built(path)
    assert {len(n.inputs) for n in _ropes(g)} == {3} and all("rope_factors_q" in ly.weights for ly in g.layers)
    after = rope_table(g)
    table = table_node(after)
    assert [r.factors for r in table.attrs.rotations] == [True]
    (pos, factors) = table.inputs
    assert factors.kind is ValueKind.WEIGHT and factors.tensor.name == "rope_freqs.weight"
    assert not any(role.startswith("rope_factors") for ly in after.layers for role in ly.weights)
    assert graph_problems(after, spec) == []


def test_a_layer_without_positions_rotates_nothing(tiny):
    """SmolLM3 leaves every fourth layer unrotated (NoPE): rope base 0, rotation -1 (a copy)."""
    spec, g = _built(tiny(**dict(FEATURE_SHAPE, **FEATURE_MODELS["smollm3"])))
    table = table_node(rope_table(g))
    assert [k for k in table.attrs.layers] == [-1 if not ly.rope_base else 0 for ly in g.layers]
    assert -1 in table.attrs.layers and len(table.attrs.rotations) == 1


def test_a_model_without_ropes_is_left_alone(tmp_path, smollm2):
    """BERT's positions are learned embeddings: no rope, no table."""
    spec, g = _built(write_bert(tmp_path / "bert.gguf", smollm2))
    assert not _ropes(g) and rope_table(g) is g
