"""Each pass, checked before and after it runs."""
from __future__ import annotations

from dataclasses import replace

import pytest

from compiler.core.dtypes import DType
from compiler.core.errors import GraphError
from compiler.core.options import CompileOptions
from compiler.frontend.architecture_file import load_architecture
from compiler.frontend.gguf_reader import read_model
from compiler.ir.builder import build_graph
from compiler.ir.graph import Op, Section, ValueKind
from compiler.ir.kv import kv_config
from compiler.passes.kernel_select import KERNELS, select_kernels
from compiler.passes.kv_insert import insert_kv_ops
from compiler.passes.kv_rotate import rotate_kv
from compiler.passes.rope_table import rope_table
from compiler.passes.scratch import add_scratch, attention_spans
from compiler.passes.share_act import share_act
from compiler.passes.validate import graph_problems, validate


def _setup(path, rows=8, **opts):
    spec = read_model(path)
    arch = load_architecture(spec.arch)
    return spec, build_graph(spec, arch, rows), kv_config(spec.hparams, CompileOptions(ctx=64, **opts))


def _names(nodes) -> list[str]:
    return [n.name for n in nodes]


def test_kv_insert_before_after(tiny):
    spec, g, kv = _setup(tiny("gemma3", n_layer=6))
    assert not any(n.op is Op.KV_STORE for n in g.nodes)
    (attn,) = [n for n in g.body if n.op is Op.ATTENTION]
    assert [v.name for v in attn.inputs] == ["q_rope", "k_rope", "v"]

    after = insert_kv_ops(g, kv)
    assert after.head == g.head and after.tail == g.tail and len(after.body) == len(g.body) + 1
    names = _names(after.body)
    w = names.index("kv_store")
    assert names[w - 1] == "k_rope" and names[w + 1] == "attn"  # right after the later of k and v
    store = after.body[w]
    assert store.outputs == () and [v.name for v in store.inputs[2:4]] == ["inp_seq", "inp_row"]
    for kv_in in store.inputs[4:]:  # K and V of one page of the layer (the runtime picks the layer's pages)
        assert kv_in.kind is ValueKind.KV and kv_in.shape == (2, kv.page_size, 16)
    assert [v.name for v in after.body[w + 1].inputs] == ["q_rope", "inp_seq", "inp_row", "inp_row", "kv_cache.k",
                                                          "kv_cache.v"]  # a causal row sees up to itself
    assert graph_problems(after, spec) == []


def test_kernel_select_before_after(tiny):
    spec, g, kv = _setup(tiny("llama", wtype=DType.Q4_1.value))
    g = insert_kv_ops(g, kv)
    with pytest.raises(GraphError, match="no kernel for rope .positions"):  # a rope reads the step's rope table
        select_kernels(g)
    g = rope_table(g)
    assert all(n.kernel is None for n in g.nodes)
    after = select_kernels(g)
    kernels = {n.name: n.kernel for n in after.nodes}
    assert kernels["q"] == kernels["result_output"] == "kiln_matmul" and kernels["inp_embd"] == "kiln_embed"
    assert kernels["q_rope"] == "kiln_rope_rotate" and kernels["rope_table"] == "kiln_rope_table"
    assert kernels["ffn_glu"] == "kiln_swiglu"
    assert kernels["kv_store"] == "kiln_kv_store" and kernels["attn"] == "kiln_attention"
    assert set(kernels.values()) <= {k.function for k in KERNELS.values()}


def test_kernel_select_follows_the_activation(tiny):
    spec, g, kv = _setup(tiny("gemma3"))
    kernels = {n.name: n.kernel for n in select_kernels(rope_table(insert_kv_ops(g, kv))).nodes}
    assert kernels["ffn_glu"] == "kiln_geglu"


def test_kernel_select_refuses_a_type_its_function_does_not_take(tiny):
    spec, g, kv = _setup(tiny("llama"))
    g = rope_table(insert_kv_ops(g, kv))
    i = _names(g.body).index("attn_norm")
    norm = g.body[i]
    layers = tuple(replace(ly, weights={**ly.weights, "attn_norm": replace(ly.weights["attn_norm"], dtype=DType.Q8_0)})
                   if ly.index == 1 else ly for ly in g.layers)
    bad = replace(g, layers=layers)
    with pytest.raises(GraphError, match=r"no kernel for rms_norm on Q8_0 data: tensor 'blk\.1\.attn_norm\.weight' "
                                         r"\(node attn_norm; kiln_rms_norm takes F32\)"):
        select_kernels(bad)
    assert select_kernels(g).body[i].kernel == "kiln_rms_norm" and norm.kernel is None


def test_validate_accepts_built_graphs(tiny, smollm2, gemma3):
    for path in (tiny("llama"), tiny("qwen2"), tiny("qwen3"), tiny("gemma3"), smollm2, gemma3):
        spec, g, _ = _setup(path)
        assert validate(g, spec) is g


def _mutate(g, name, **changes):
    i = _names(g.body).index(name)
    return g.with_nodes(Section.BODY, g.body[:i] + (replace(g.body[i], **changes),) + g.body[i + 1:])


def test_validate_catches_faults(tiny):
    spec, g, _ = _setup(tiny("llama"))
    nodes = {n.name: n for n in g.nodes}

    early = _mutate(g, "attn_norm", inputs=(nodes["q"].outputs[0], nodes["attn_norm"].inputs[1]))
    assert any("body op attn_norm: input 'q' is used before it is defined" in p for p in graph_problems(early, spec))

    twice = _mutate(g, "k", inputs=(nodes["k"].inputs[0], nodes["q"].inputs[1]))
    problems = graph_problems(twice, spec)
    assert "weight 'attn_q' is used 2 times (expected exactly once)" in problems
    assert any("layer 0 binds" in p and "attn_k" in p for p in problems)  # a role the body no longer uses
    assert any("body op k: matmul" in p for p in problems)  # q's weight is 64x64, k's output 2x16

    wrong_shape = _mutate(g, "ffn_glu", outputs=(replace(nodes["ffn_glu"].outputs[0], shape=(8, 64)),))
    assert any("glu: shapes" in p for p in graph_problems(wrong_shape, spec))

    no_attrs = _mutate(g, "q_rope", attrs=None)
    assert any("rope needs attrs RopeAttrs" in p for p in graph_problems(no_attrs, spec))

    x = g.state[0]
    out_of_place = _mutate(g, "ffn_inp", inputs=(nodes["attn_out"].outputs[0], nodes["attn_out"].outputs[0]),
                           outputs=(x,))
    assert any("must add to the state itself" in p for p in graph_problems(out_of_place, spec))
    overwrites_state = _mutate(g, "attn_out", outputs=(x,))
    assert any("matmul writes the state 'x'" in p for p in graph_problems(overwrites_state, spec))

    head_sees_body = g.with_nodes(Section.TAIL, (replace(g.tail[0], inputs=(nodes["q"].outputs[0],
                                                                            g.tail[0].inputs[1])),) + g.tail[1:])
    assert any("tail op result_norm: input 'q' is used before it is defined" in p
               for p in graph_problems(head_sees_body, spec))

    with pytest.raises(GraphError, match="the step graph is invalid"):
        validate(early, spec)


def test_every_layer_binds_a_tensor_of_the_same_shape(tiny):
    path = tiny("llama", shapes={"blk.1.ffn_up.weight": (100, 64)})
    with pytest.raises(Exception, match=r"'blk\.1\.ffn_up\.weight' is \[100, 64\] but 'blk\.0\.ffn_up\.weight' "
                                        r"is \[128, 64\]"):
        _setup(path)


def test_scratch_before_after(tiny):
    spec, g, kv = _setup(tiny("llama", wtype=DType.Q4_1.value))
    g = select_kernels(rope_table(insert_kv_ops(g, kv)))
    assert all(n.scratch is None for n in g.nodes)
    after = add_scratch(g, kv)
    scratch = {n.name: n.scratch for n in after.nodes if n.scratch is not None}
    assert set(scratch) == {n.name for n in g.nodes if n.op in (Op.MATMUL, Op.LOGITS, Op.ATTENTION)}
    # 8 rows of 64 activations as two q8_1 blocks, then a tile of 8 rows' scales: 3 numbers a block and row
    assert scratch["q"].nbytes == 8 * 2 * 36 + 3 * 4 * 8 * 2
    assert scratch["result_output"].nbytes == 8 * 2 * 36 + 3 * 4 * 8 * 2  # the tied head is Q4_1 too
    # attention gets room for the span states of a lone token's history: f32 x n_head x spans x (head_dim + 2)
    assert attention_spans(kv) == -(-kv.ctx // 64)
    assert scratch["attn"].nbytes == 4 * 4 * attention_spans(kv) * (16 + 2)


def test_scratch_fits_the_layer_that_needs_the_most(tiny):
    """A Q4_K_M file mixes types across layers: ffn_down's activations are q8_K (292 bytes a 256)
    in the layer whose ffn_down is Q4_K, q8_1 (36 a 32) in the others."""
    spec, g, kv = _setup(tiny("llama", n_ff=256, wtype=DType.Q4_1.value, types={"blk.1.ffn_down.weight": DType.Q4_K.value}))
    after = add_scratch(select_kernels(rope_table(insert_kv_ops(g, kv))), kv)
    down = next(n for n in after.body if n.name == "ffn_out")
    assert down.scratch.nbytes == max(-(-8 * 292 // 64) * 64, 8 * 8 * 36 + 3 * 4 * 8 * 8)  # q8_1's with its scales


def test_share_act_before_after(tiny):
    """q, k and v read one normed row set, and so do gate and up: the first of each run quantizes,
    the others read its copy, from one scratch that lives across the run."""
    spec, g, kv = _setup(tiny("llama", wtype=DType.Q4_1.value))
    g = insert_kv_ops(g, kv)
    assert all(n.attrs.act_from is None for n in g.nodes if n.op is Op.MATMUL)
    after = add_scratch(select_kernels(rope_table(share_act(g))), kv)
    by_name = {n.name: n for n in after.body}
    assert {n: by_name[n].attrs.act_from for n in ("q", "k", "v", "attn_out", "ffn_gate", "ffn_up", "ffn_out")} == {
        "q": None, "k": "q", "v": "q", "attn_out": None, "ffn_gate": None, "ffn_up": "ffn_gate", "ffn_out": None}
    assert [by_name[n].kernel for n in ("q", "k", "ffn_up")] == ["kiln_matmul", "kiln_matmul_quantized",
                                                                 "kiln_matmul_quantized"]
    assert by_name["k"].scratch is by_name["q"].scratch and by_name["ffn_up"].scratch is by_name["ffn_gate"].scratch
    # each knows its rows' place in its run, which the threads share out as one matrix; alone, none
    rows = {n: by_name[n].inputs[1].shape[0] for n in by_name if by_name[n].op is Op.MATMUL}
    qkv, ffn = rows["q"] + rows["k"] + rows["v"], rows["ffn_gate"] + rows["ffn_up"]
    assert {n: (by_name[n].attrs.run_at, by_name[n].attrs.run_rows) for n in rows} == {
        "q": (0, qkv), "k": (rows["q"], qkv), "v": (rows["q"] + rows["k"], qkv), "attn_out": (0, 0),
        "ffn_gate": (0, ffn), "ffn_up": (rows["ffn_gate"], ffn), "ffn_out": (0, 0)}
    assert graph_problems(after, spec) == []


def test_share_act_needs_one_format_in_every_layer(tiny):
    """Layer 1's v is Q4_K (q8_K activations), the rest Q4_1 (q8_1): v quantizes its own rows in
    every layer, k still reads q's; the shared scratch is sized for the largest reader."""
    spec, g, kv = _setup(tiny("llama", n_embd=256, n_head=4, n_head_kv=2, wtype=DType.Q4_1.value,
                              types={"blk.1.attn_v.weight": DType.Q4_K.value}))
    after = add_scratch(select_kernels(rope_table(share_act(insert_kv_ops(g, kv)))), kv)
    by_name = {n.name: n for n in after.body}
    assert (by_name["k"].attrs.act_from, by_name["v"].attrs.act_from) == ("q", None)
    q8_1 = 8 * 8 * 36 + 3 * 4 * 8 * 8  # rows and their x8 scales, over q8_K's 8 * 292 in layer 1's v
    assert by_name["v"].scratch.nbytes == max(-(-8 * 292 // 64) * 64, q8_1) and by_name["q"].scratch.nbytes == q8_1


@pytest.mark.parametrize("k,v,rotated", [("f16", "f16", ""), ("q8_0", "f16", "k"), ("f16", "q4_0", "v"),
                                          ("q4_0", "q4_0", "kv")])
def test_kv_rotate_before_after(tiny, k, v, rotated):
    """A quantized K brings q_rot and k_rot in front of attention; a quantized V brings v_rot, and
    the attention's output is rotated back (attn_rot -> attn). Float caches are left alone."""
    spec, g, kv = _setup(tiny("llama", n_embd=128, n_head=2, n_head_kv=1), kv_dtype_k=k, kv_dtype_v=v)
    after = rotate_kv(g, kv)
    added = [n.name for n in after.body if n.op is Op.HADAMARD]
    assert added == ["q_rot", "k_rot"] * ("k" in rotated) + ["v_rot", "attn"] * ("v" in rotated)
    (attn,) = [n for n in after.body if n.op is Op.ATTENTION]
    assert [x.name for x in attn.inputs] == ["q_rot" if "k" in rotated else "q_rope",
                                             "k_rot" if "k" in rotated else "k_rope", "v_rot" if "v" in rotated else "v"]
    assert attn.outputs[0].name == ("attn_rot" if "v" in rotated else "attn")
    assert graph_problems(after, spec) == []
    off = kv_config(spec.hparams, CompileOptions(ctx=64, kv_dtype_k=k, kv_dtype_v=v, kv_rotation=False))
    assert rotate_kv(g, off) is g


# -- the new architectures' ops and variants ------------------------------------------------------------------
def _feature(tiny, name, **kw):
    from compiler.tools.synthetic_features import FEATURE_MODELS, FEATURE_SHAPE
    return tiny(**dict(FEATURE_SHAPE, **FEATURE_MODELS[name], **kw))


@pytest.mark.parametrize("name,attn,tail", [
    ("llama-rope-freqs", "kiln_attention", ["kiln_matmul"]),  # factors: the rope table reads them
    ("qwen2-yarn", "kiln_attention", ["kiln_matmul"]),  # scaled
    ("granite", "kiln_attention", ["kiln_matmul", "kiln_scale"]),
    ("gemma2", "kiln_attention_ext", ["kiln_matmul", "kiln_softcap"]),
])
def test_kernel_select_picks_the_variant_an_attribute_asks_for(tiny, name, attn, tail):
    """Before: no kernels. After: a capped attention runs kiln_attention_ext, the logits' scale and
    cap their own kernels; the plain ones are unchanged, and every rope, scaled, factored or not,
    rotates by the step's rope table."""
    spec, g, kv = _setup(_feature(tiny, name))
    g = rope_table(insert_kv_ops(g, kv))
    assert all(n.kernel is None for n in g.nodes)
    kernels = {n.name: n.kernel for n in select_kernels(g).nodes}
    assert kernels["q_rope"] == kernels["k_rope"] == "kiln_rope_rotate" and kernels["attn"] == attn
    assert [kernels[n.name] for n in g.tail][2:] == tail
    if name == "granite":
        assert kernels["attn_scaled"] == kernels["ffn_scaled"] == "kiln_scale"


def test_kv_passes_keep_the_caps_and_the_factors(tiny):
    """Rotating a quantized cache and inserting the cache writes rebuild the attention and keep its
    soft-cap; a factored rope keeps its factors input, and the cache stores what it wrote."""
    spec, g, kv = _setup(_feature(tiny, "gemma2"), kv_dtype="q4_0")
    after = insert_kv_ops(rotate_kv(g, kv), kv)
    (attn,) = [n for n in after.body if n.op is Op.ATTENTION]
    assert attn.name == "attn_rot" and attn.attrs.softcap == 5.0 and graph_problems(after, spec) == []
    spec, g, kv = _setup(_feature(tiny, "llama-rope-freqs"), kv_dtype="q8_0")
    after = insert_kv_ops(rotate_kv(g, kv), kv)
    names = [n.name for n in after.body]
    assert names.index("kv_store") == names.index("k_rope") + 1  # the cache holds the rotated, factored keys
    assert [v.name for v in after.body[names.index("k_rope")].inputs] == ["k", "inp_pos", "rope_factors_k"]
    assert graph_problems(after, spec) == []


def test_validate_allows_in_place_only_on_the_output_by_the_scale_and_the_cap(tiny):
    spec, g, _ = _setup(_feature(tiny, "gemma2"))
    assert graph_problems(g, spec) == []
    capped = g.tail[-1]
    logits_twice = g.with_nodes(Section.TAIL, g.tail[:-1] + (replace(capped, op=Op.GLU, attrs=None),))
    assert any("'result_output' is defined twice" in p for p in graph_problems(logits_twice, spec))
    norm = next(n for n in g.body if n.name == "ffn_norm")  # an in-place op on an activation is a redefinition
    in_place = _mutate(g, "ffn_post_norm", inputs=(norm.outputs[0], norm.inputs[1]), outputs=norm.outputs)
    assert any("'ffn_norm' is defined twice" in p for p in graph_problems(in_place, spec))


def test_validate_checks_the_rope_factors_and_the_unread_tensors(tiny):
    spec, g, _ = _setup(_feature(tiny, "phi3-long"))
    assert g.unused == ("rope_factors_long.weight",)  # no context given: the short factors
    assert graph_problems(g, spec) == []
    forgotten = replace(g, unused=())
    assert "tensor 'rope_factors_long.weight' of tiny-phi3.gguf is not used by the phi3 architecture" in \
        graph_problems(forgotten, spec)
    q_rope = next(n for n in g.body if n.name == "q_rope")
    wrong = _mutate(g, "q_rope", inputs=q_rope.inputs[:2] + (replace(q_rope.inputs[2], shape=(8,)),))
    assert any("frequency factors [(8,)] are not one vector of n_rot / 2 = 16" in p for p in graph_problems(wrong, spec))


# -- a mixture of experts: moe_route and moe_ffn ----------------------------------------------------------------
@pytest.mark.parametrize("name", ["qwen3moe", "olmoe"])
def test_moe_ops_before_and_after_the_passes(tiny, name):
    """The builder puts the router's matmul, moe_route and moe_ffn where a dense FFN's gate, up and
    down were; kernel select gives them their kernels, the scratch pass the slots moe.c carves
    (sized for the step's rows), and validate takes the graph."""
    from compiler.passes.scratch import moe_scratch_bytes
    spec, g, kv = _setup(_feature(tiny, name, wtype=DType.Q8_0.value))
    ops = [n.op for n in g.body]
    assert Op.GLU not in ops and ops.count(Op.MOE_ROUTE) == ops.count(Op.MOE_FFN) == 1
    route, ffn = (next(n for n in g.body if n.op is op) for op in (Op.MOE_ROUTE, Op.MOE_FFN))
    assert [v.name for v in route.inputs] == ["ffn_moe_logits"] and route.attrs.normalize == (name == "qwen3moe")
    assert [v.name for v in ffn.inputs] == ["ffn_norm", "ffn_moe_topk", "ffn_moe_weights", "ffn_gate_exps",
                                            "ffn_up_exps", "ffn_down_exps"]
    assert graph_problems(g, spec) == [] and route.kernel is None and ffn.scratch is None
    after = add_scratch(select_kernels(rope_table(insert_kv_ops(g, kv))), kv)
    nodes = {n.name: n for n in after.body}
    assert nodes["ffn_moe_logits"].kernel == "kiln_matmul" and nodes["ffn_moe_topk"].kernel == "kiln_moe_route"
    assert nodes["ffn_moe_out"].kernel == "kiln_moe_ffn" and nodes["ffn_moe_topk"].scratch is None
    hp = spec.hparams
    assert nodes["ffn_moe_out"].scratch.nbytes == moe_scratch_bytes(DType.Q8_0, DType.Q8_0, DType.Q8_0, 8, hp.n_expert,
                                                                     hp.n_expert_used, hp.n_ff_exp, hp.n_embd)
    assert graph_problems(after, spec) == []


def test_validate_catches_moe_faults(tiny):
    spec, g, _ = _setup(_feature(tiny, "qwen3moe"))
    route, ffn = (next(n for n in g.body if n.op is op) for op in (Op.MOE_ROUTE, Op.MOE_FFN))
    too_many = _mutate(g, "ffn_moe_topk", attrs=replace(route.attrs, n_used=9))
    assert any("top 9 of 8" in p for p in graph_problems(too_many, spec))
    ids = ffn.inputs[1]
    short = _mutate(g, "ffn_moe_out", inputs=(ffn.inputs[0], replace(ids, shape=(8, 1)), *ffn.inputs[2:]))
    assert any("ids (8, 1)" in p for p in graph_problems(short, spec))
    swapped = _mutate(g, "ffn_moe_out", inputs=(*ffn.inputs[:3], ffn.inputs[5], ffn.inputs[4], ffn.inputs[3]))
    assert any("experts" in p for p in graph_problems(swapped, spec))


def test_moe_expert_tensors_must_have_the_metadata_shapes(tiny):
    path = _feature(tiny, "qwen3moe", shapes={"blk.0.ffn_up_exps.weight": (8, 128, 128)})
    with pytest.raises(Exception, match=r"ffn_up_exps\.weight' is \[8, 128, 128\] but expert_count 8"):
        _setup(path)
