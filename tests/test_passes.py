"""Each pass, checked before and after it runs."""
from __future__ import annotations

from dataclasses import replace

import pytest

from compiler.ir.builder import build_decode, build_prefill
from compiler.core.dtypes import DType
from compiler.core.errors import GraphError
from compiler.frontend.gguf_reader import read_model
from compiler.ir.graph import Op, ValueKind
from compiler.core.options import CompileOptions
from compiler.passes.kernel_select import KERNELS, select_kernels
from compiler.passes.kv_insert import insert_kv_ops
from compiler.passes.kv_rotate import rotate_kv
from compiler.passes.validate import graph_problems, validate
from compiler.planner.kv_plan import plan_kv
from compiler.frontend.architecture import load_architecture


def _setup(path, chunk=8, **opts):
    spec = read_model(path)
    arch = load_architecture(spec.arch)
    kv = plan_kv(spec.hparams, arch, CompileOptions(ctx=64, prefill_chunk=chunk, **opts))
    return spec, arch, kv


@pytest.mark.parametrize("mode", ["decode", "prefill"])
def test_kv_insert_before_after(tiny, mode):
    spec, arch, kv = _setup(tiny("gemma3", n_layer=6))
    g = build_decode(spec, arch) if mode == "decode" else build_prefill(spec, arch, 8)
    write_op = Op.KV_STORE if mode == "decode" else Op.KV_BATCH_COPY
    assert not any(n.op in (Op.KV_STORE, Op.KV_BATCH_COPY) for n in g.nodes)
    before = [n for n in g.nodes if n.op is Op.ATTENTION]
    assert all(tuple(v.name.split("-")[0] for v in n.inputs) == ("q_rope", "k_rope", "v") for n in before)

    after = insert_kv_ops(g, kv)
    assert len(after.nodes) == len(g.nodes) + spec.hparams.n_layer
    labels = [n.label for n in after.nodes]
    for il in range(6):
        w = labels.index(f"kv_{'store' if mode == 'decode' else 'copy'}-{il}")
        assert labels[w - 1] == f"k_rope-{il}" and labels[w + 1] == f"attn-{il}"
        node = after.nodes[w]
        assert node.op is write_op and node.outputs == ()
        assert [v.name for v in node.inputs[2:4]] == ["inp_seq", "inp_row"]
        for kv_in in node.inputs[4:]:  # K and V of one page of the layer
            assert kv_in.kind is ValueKind.KV and kv_in.shape == (2, kv.page_size, 16)
        attn = after.nodes[w + 1]
        assert [v.name for v in attn.inputs] == [f"q_rope-{il}", "inp_seq", "inp_row", f"kv_cache-{il}.k",
                                                 f"kv_cache-{il}.v"]
    assert graph_problems(after, spec) == []


def test_kernel_select_before_after(tiny):
    spec, arch, kv = _setup(tiny("llama", wtype=DType.Q4_1.value))
    g = insert_kv_ops(build_decode(spec, arch), kv)
    assert all(n.kernel is None for n in g.nodes)
    after = select_kernels(g)
    kernels = {n.label: n.kernel for n in after.nodes}
    # decode matmuls on 8-row multiples read weights interleaved by eight rows
    assert kernels["q-0"] == "matmul_x8_q4_1" and kernels["inp_embd"] == "embed_q4_1"
    assert kernels["q_rope-0"] == "rope_pairwise_f32" and kernels["ffn_glu-1"] == "swiglu_f32"
    assert kernels["kv_store-0"] == "kv_store_f32" and kernels["attn-0"] == "attention_decode_f32"
    assert set(kernels.values()) <= set(KERNELS.values())


def test_kernel_select_follows_kv_dtype_and_mode(tiny):
    spec, arch, kv = _setup(tiny("qwen3", n_embd=128), kv_dtype="q8_0")
    after = select_kernels(insert_kv_ops(build_prefill(spec, arch, 8), kv))
    kernels = {n.label: n.kernel for n in after.nodes}
    assert kernels["attn-1"] == "attention_prefill_q8_0" and kernels["kv_copy-1"] == "kv_batch_copy_q8_0"
    assert kernels["q_rope-0"] == "rope_neox_f32" and kernels["q-0"] == "matmul_f32"  # f32 is not packed


def test_x8_kernels_for_matmuls_on_whole_groups_of_rows(tiny):
    spec, arch, kv = _setup(tiny("llama", wtype=DType.Q8_0.value))
    decode = {n.label: n.kernel for n in select_kernels(insert_kv_ops(build_decode(spec, arch), kv)).nodes}
    prefill = {n.label: n.kernel for n in select_kernels(insert_kv_ops(build_prefill(spec, arch, 8), kv)).nodes}
    assert decode["ffn_gate-0"] == prefill["ffn_gate-0"] == "matmul_x8_q8_0"
    head = "logits_x8_q8_0" if spec.hparams.n_vocab % 8 == 0 else "logits_q8_0"
    assert decode["result_output"] == prefill["result_output"] == head
    spec12, tmpl12, kv12 = _setup(tiny("llama", wtype=DType.Q8_0.value, n_head=8, n_head_kv=1, head_dim=12))
    odd = {n.label: n.kernel for n in select_kernels(insert_kv_ops(build_decode(spec12, tmpl12), kv12)).nodes}
    assert odd["k-0"] == "matmul_q8_0" and odd["q-0"] == "matmul_x8_q8_0"  # 12 rows are not whole groups; 96 are


def test_kernel_select_missing_kernel_is_an_error(tiny):
    spec, arch, kv = _setup(tiny("llama"))
    g = insert_kv_ops(build_decode(spec, arch), kv)
    bad = next(i for i, n in enumerate(g.nodes) if n.op is Op.ADD)
    i32 = replace(g.nodes[bad].inputs[0], dtype=DType.I32)
    g = replace(g, nodes=g.nodes[:bad] + (replace(g.nodes[bad], inputs=(i32,) + g.nodes[bad].inputs[1:]),) + g.nodes[bad + 1:])
    with pytest.raises(GraphError, match=r"no kernel for add .* on I32 data at node ffn_inp-0"):
        select_kernels(g)


def test_validate_accepts_built_graphs(tiny, smollm2, gemma3):
    for path in (tiny("llama"), tiny("qwen2"), tiny("qwen3"), tiny("gemma3"), smollm2, gemma3):
        spec, arch, _ = _setup(path)
        assert validate(build_decode(spec, arch), spec)
        assert graph_problems(build_prefill(spec, arch, 4), spec) == []


def _mutate(g, label, **changes):
    i = next(i for i, n in enumerate(g.nodes) if n.label == label)
    return replace(g, nodes=g.nodes[:i] + (replace(g.nodes[i], **changes),) + g.nodes[i + 1:])


def test_validate_catches_faults(tiny):
    spec, arch, _ = _setup(tiny("llama"))
    g = build_decode(spec, arch)
    nodes = {n.label: n for n in g.nodes}

    swapped = _mutate(g, "attn_norm-0", inputs=(nodes["ffn_inp-0"].outputs[0], nodes["attn_norm-0"].inputs[1]))
    assert any("'ffn_inp-0' is used before it is defined" in p for p in graph_problems(swapped, spec))

    twice = _mutate(g, "k-0", inputs=(nodes["k-0"].inputs[0], nodes["q-0"].inputs[1]))
    problems = graph_problems(twice, spec)
    assert "weight 'blk.0.attn_q.weight' is used 2 times (expected exactly once)" in problems
    assert any("tensor 'blk.0.attn_k.weight'" in p and "not used" in p for p in problems)
    assert any("op 3 (k-0): matmul" in p for p in problems)  # q weight is 64x64, k output is 2x16

    wrong_shape = _mutate(g, "ffn_glu-0", outputs=(replace(nodes["ffn_glu-0"].outputs[0], shape=(1, 64)),))
    assert any("glu: shapes" in p for p in graph_problems(wrong_shape, spec))

    no_attrs = _mutate(g, "q_rope-1", attrs=None)
    assert any("rope needs attrs RopeAttrs" in p for p in graph_problems(no_attrs, spec))

    with pytest.raises(GraphError, match="the decode graph is invalid"):
        validate(swapped, spec)


def test_scratch_before_after(tiny):
    from compiler.passes.scratch import add_scratch, attention_spans

    spec, arch, kv = _setup(tiny("llama", wtype=DType.Q4_1.value))
    g = select_kernels(insert_kv_ops(build_prefill(spec, arch, 8), kv))
    assert all(n.scratch is None for n in g.nodes)
    after = add_scratch(g, kv)
    scratch = {n.label: n.scratch for n in after.nodes if n.scratch is not None}
    assert set(scratch) == {n.label for n in g.nodes if n.op in (Op.MATMUL, Op.LOGITS, Op.ATTENTION)}
    assert scratch["q-0"].nbytes == 8 * 2 * 36  # 8 rows of 64 activations as two q8_1 blocks
    assert scratch["result_output"].nbytes == 8 * 2 * 36  # the tied head is Q4_1 too
    # attention gets room for the span states of a lone token's history: f32 x n_head x spans x (head_dim + 2)
    assert attention_spans(kv) == -(-kv.ctx // 64)
    assert scratch["attn-0"].nbytes == 4 * 4 * attention_spans(kv) * (16 + 2)


@pytest.mark.parametrize("k,v,rotated", [("f16", "f16", ""), ("q8_0", "f16", "k"), ("f16", "q4_0", "v"),
                                          ("q4_0", "q4_0", "kv")])
def test_kv_rotate_before_after(tiny, k, v, rotated):
    """A quantized K brings q_rot and k_rot in front of attention; a quantized V brings v_rot, and
    the attention's output is rotated back (attn_rot -> attn). Float caches are left alone."""
    spec = read_model(tiny("llama", n_embd=128, n_head=2, n_head_kv=1))
    arch = load_architecture(spec.arch)
    g = build_decode(spec, arch)
    after = rotate_kv(g, plan_kv(spec.hparams, arch, CompileOptions(ctx=64, kv_dtype_k=k, kv_dtype_v=v)))
    added = [n.label for n in after.nodes if n.op is Op.HADAMARD]
    want = [f"{name}-{il}" for il in range(spec.hparams.n_layer)
            for name in ("q_rot", "k_rot") * ("k" in rotated) + ("v_rot", "attn") * ("v" in rotated)]
    assert added == want
    for n in (n for n in after.nodes if n.op is Op.ATTENTION):
        names = [x.name.split("-")[0] for x in n.inputs]
        assert names == ["q_rot" if "k" in rotated else "q_rope", "k_rot" if "k" in rotated else "k_rope",
                         "v_rot" if "v" in rotated else "v"]
        assert n.outputs[0].name.startswith("attn_rot" if "v" in rotated else "attn")
    assert graph_problems(after, spec) == []
    compiler_off = plan_kv(spec.hparams, arch, CompileOptions(ctx=64, kv_dtype_k=k, kv_dtype_v=v,
                                                                    kv_rotation=False))
    assert rotate_kv(g, compiler_off) is g
