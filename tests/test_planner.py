"""The memory planner: KV region sizes and offsets, activation lifetimes, events and the allocator."""
from __future__ import annotations

import random

import pytest

from compiler.core.dtypes import DType
from compiler.core.errors import OptionError
from compiler.ir.graph import Value, ValueKind
from compiler.core.options import CompileOptions
from compiler.planner.plan import plan
from compiler.planner.allocator import allocate, arena_bytes
from compiler.planner.events import EventKind, events, peak_live_bytes
from compiler.planner.kv_plan import align
from compiler.planner.liveness import Lifetime, lifetimes


def assert_no_live_overlap(buffers):
    """No two buffers that are live at one op share a byte; every offset is 64-byte aligned."""
    for b in buffers:
        assert b.offset % 64 == 0, b
    by_offset = sorted(buffers, key=lambda b: b.offset)
    for i, a in enumerate(by_offset):
        for b in by_offset[i + 1:]:
            if b.offset >= a.offset + a.size:
                break
            time_overlap = a.first_op <= b.last_op and b.first_op <= a.last_op
            assert not time_overlap, f"{a.name} and {b.name} overlap in memory while both are live"


# -- KV region --------------------------------------------------------------------------------
@pytest.mark.parametrize("kv_dtype, expected", [("f32", 47_185_920), ("f16", 23_592_960), ("q8_0", 12_533_760)])
def test_smollm2_kv_bytes(smollm2, kv_dtype, expected):
    lay = plan(smollm2, CompileOptions(ctx=1024, kv_dtype=kv_dtype)).layout
    assert lay.kv.total_bytes == expected == 2 * 30 * 3 * 1024 * DType[kv_dtype.upper()].nbytes(64)
    assert lay.kv.full_context_bytes == expected  # dense model: nothing to save


@pytest.mark.parametrize("kv_dtype", ["f32", "f16", "q8_0"])
def test_gemma3_sliding_layers_keep_their_saving_in_pages(gemma3, kv_dtype):
    opts = CompileOptions(ctx=8192, kv_dtype=kv_dtype)
    kv = plan(gemma3, opts).layout.kv
    row = DType[kv_dtype.upper()].nbytes(256)
    full, sliding = kv.groups
    assert full.window is None and full.layers == (5, 11, 17) and len(sliding.layers) == 15
    assert full.n_pages == 8192 // 64 and full.page_bytes == 3 * 2 * 64 * row
    # the window of 512 plus a step of 256 rows, at any alignment: ceil(766 / 64) + 1 pages
    assert sliding.window == 512 and sliding.seq_pages == 13 and sliding.n_pages == 13
    assert kv.full_context_bytes == 18 * 2 * 8192 * row
    assert kv.total_bytes <= 0.3 * kv.full_context_bytes  # the issue asks for a saving of at least 70%


def test_sliding_bound_never_exceeds_context(gemma3):
    kv = plan(gemma3, CompileOptions(ctx=300, prefill_chunk=64)).layout.kv
    assert {g.seq_pages for g in kv.groups} == {5}  # ceil(300 / 64)


@pytest.mark.parametrize("k,v", [("f32", "f32"), ("q8_0", "q4_0")])
def test_kv_offsets_are_closed_form_and_disjoint(tiny, k, v):
    kv = plan(tiny("gemma3", n_layer=6, head_dim=32), CompileOptions(ctx=40, prefill_chunk=4, n_seq=2, page_size=8,
                                                       kv_dtype_k=k, kv_dtype_v=v)).layout.kv
    assert kv.k_transposed == (k == "f32")  # f32 and f16 K are held transposed: each value is a piece
    es, hd = kv.k_row_bytes // 32, 32
    rows = []
    for ly in kv.layers:
        for page in range(kv.groups[ly.group].n_pages):
            for part, size in ((0, kv.k_row_bytes), (1, kv.v_row_bytes)):
                for h in range(kv.config.n_head_kv):
                    for r in range(kv.config.page_size):
                        if part == 0 and kv.k_transposed:
                            rows += [(kv.offset(page, ly.layer, 0, h, r, d), es) for d in range(hd)]
                        else:
                            rows.append((kv.offset(page, ly.layer, part, h, r), size))
    rows.sort()
    assert rows[0][0] >= 0 and rows[-1][0] + rows[-1][1] <= kv.total_bytes
    assert all(a + n <= b for (a, n), (b, _) in zip(rows, rows[1:]))  # no two rows overlap
    full, sliding = kv.groups
    assert full.n_pages == 2 * 5 and sliding.seq_pages == -(-(8 + 4 - 2) // 8) + 1 == 3
    assert kv.offset(1, 5, 0, 0, 0) - kv.offset(0, 5, 0, 0, 0) == full.page_bytes
    assert kv.total_bytes == full.n_pages * full.page_bytes + sliding.n_pages * sliding.page_bytes


def test_q8_0_kv_needs_whole_blocks(tiny):
    with pytest.raises(OptionError, match="q8_0 stores blocks of 32 but head_dim is 16"):
        plan(tiny("llama"), CompileOptions(kv_dtype="q8_0"))


# -- activations ---------------------------------------------------------------------------------
def _value(name, nbytes):
    return Value(name, ValueKind.ACTIVATION, (nbytes // 4,), DType.F32)


def _random_lifetimes(seed, n=60, horizon=40):
    rng = random.Random(seed)
    out = []
    for i in range(n):
        first = rng.randrange(horizon)
        out.append(Lifetime(_value(f"t{i}", 4 * rng.randrange(1, 3000)), first, first + rng.randrange(0, 8)))
    return out


@pytest.mark.parametrize("seed", range(25))
def test_allocator_on_synthetic_lifetimes(seed):
    lts = _random_lifetimes(seed)
    placed = allocate(events(lts))
    assert len(placed) == len(lts)
    for p in placed:
        assert p.offset % 64 == 0 and p.size == align(p.lifetime.value.nbytes)
    for i, a in enumerate(placed):
        for b in placed[i + 1:]:
            if a.lifetime.overlaps(b.lifetime):
                assert a.end <= b.offset or b.end <= a.offset, (a, b)
    peak = peak_live_bytes(events(lts), lambda lt: align(lt.value.nbytes))
    assert peak <= arena_bytes(placed) <= sum(p.size for p in placed)
    shuffled = lts[:]
    random.Random(seed + 1000).shuffle(shuffled)
    assert allocate(events(shuffled)) == placed  # order of discovery does not matter


def test_events_put_allocs_before_frees_at_one_op():
    a, b = Lifetime(_value("a", 64), 0, 3), Lifetime(_value("b", 64), 3, 5)
    evs = events([b, a])
    assert [(e.op, e.kind, e.lifetime.value.name) for e in evs] == [
        (0, EventKind.ALLOC, "a"), (3, EventKind.ALLOC, "b"), (3, EventKind.FREE, "a"), (5, EventKind.FREE, "b")]
    assert peak_live_bytes(evs, lambda lt: lt.value.nbytes) == 128  # a is read while b is written


def test_lifetimes_of_a_real_graph(smollm2):
    g = plan(smollm2, CompileOptions(ctx=128)).graph
    lts = {lt.value.name: lt for lt in lifetimes(g)}
    names = [n.name for n in g.nodes]
    assert "inp_tokens" not in lts and "result_output" not in lts  # the batch and the logits are the caller's
    state = {v.name for v in g.state}
    assert state == {"x", "rope_table"}  # the residual stream, and each row's rope rotations
    assert all((lts[v].first, lts[v].last) == (0, len(g.nodes) - 1) for v in state)  # the whole step
    assert lts["attn_norm"].first == names.index("attn_norm") and lts["attn_norm"].last == names.index("v")
    assert all(g.section_of(lt.first) is g.section_of(lt.last) for name, lt in lts.items() if name not in state)
    assert lts["result_norm"].last == len(g.nodes) - 2  # the rows asked for are selected, then the LM head
    assert lts["result_rows"].last == len(g.nodes) - 1


def test_a_body_buffer_is_the_same_bytes_in_every_layer(smollm2):
    """The body runs once per layer in the same arena bytes: its buffers live within one run, apart
    from the state, which the planner keeps for the whole step."""
    lay = plan(smollm2, CompileOptions(ctx=128)).layout
    body = [name for name, first, last in lay.sections if name.startswith("body")]
    assert body == ["body x 30 layers"]
    acts = {b.name: b for b in lay.region("activations")}
    assert len(acts) == len({b.name for b in lay.region("activations")})  # one buffer per value, not per layer
    _, first, last = lay.sections[1]
    assert all(first <= b.first_op and b.last_op <= last for b in acts.values()
               if first <= b.first_op <= last and b.name not in ("x", "rope_table"))


@pytest.mark.parametrize("model", ["smollm2", "gemma3"])
def test_real_models_no_overlap(request, model):
    lay = plan(request.getfixturevalue(model), CompileOptions(ctx=2048)).layout
    acts = lay.region("activations")
    assert_no_live_overlap(acts)
    assert lay.activation_peak_live_bytes <= lay.activation_bytes < lay.activation_bytes_without_reuse
    assert max(b.offset + b.size for b in acts) == lay.activation_bytes
    kv = lay.region("kv")
    assert sum(b.size for b in kv) == sum(g.page_bytes for g in lay.kv.groups)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "gemma3"])
def test_synthetic_models_no_overlap(tiny, arch):
    assert_no_live_overlap(plan(tiny(arch, n_layer=6), CompileOptions(ctx=64, prefill_chunk=16))
                           .layout.region("activations"))


def test_weights_are_file_views(smollm2):
    lay = plan(smollm2, CompileOptions(ctx=64)).layout
    w = {b.name: b for b in lay.region("weights")}
    assert w["output.weight"].offset == w["token_embd.weight"].offset == 1785664
    assert w["output.weight"].note == "view of token_embd.weight"
    assert lay.weights_bytes == sum(b.size for b in lay.region("weights") if not b.note)
