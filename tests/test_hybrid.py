"""Qwen3.5's hybrid (templates/qwen35.json): Gated DeltaNet layers beside gated full attention,
on synthetic GGUFs that llama.cpp itself loads (compiler/tools/synthetic.py's qwen35 branch,
written from llama.cpp's loader rather than from kiln's template).

The logits. With F32 weights both engines compute the same arithmetic but for the order of a few
sums (and kiln's own exp and log), so kiln lands at the floor the other architectures hold (1e-9;
measured about 1e-11). Every DeltaNet feature moves the logits far above it: the same model with
the feature switched off in the file (no decay, a constant write strength, the conv's taps an
identity, a constant output gate, a full rope) is compared with llama.cpp running the real one.
The pairing of value heads with key heads is held by the floor itself: tests/qwen35_reference.py's
float64 pass with the other pairing misses llama.cpp by orders of magnitude.

Q8_0 weights: both engines quantize each activation to 8 bits before a matmul, and where their
values are an ulp apart one now and then rounds to the other step; the recurrent state, like the
KV cache, carries such a step on. How often that happens grows with the activations: with norms
near 1 (the F32 model's) one position in twenty flips (mean KL 1e-3, each flip a spike of 1e-3 at
its token); with norms near 0.3, measured 1.7e-13 on this seed, 6e-5 on the next. The test holds
the seed at 1e-6, as tests/test_archs.py holds the other architectures' quantized paths.

The state. A recurrence is sequential within a sequence, so it runs token by token in one order
of operations: a token's logits are the same bits however its sequence was chunked or batched and
whatever the thread count. A state holds every position at once, so a rollback into it, a context
shift and a prefix's borrowed pages are refused by name; a fork copies it, and a saved sequence
carries it.
"""
from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

import compiler
from compiler.core.options import CompileOptions
from compiler.planner.plan import plan
from compiler.runtime import ModelError
from qwen35_reference import Variant, forward
from reference import Reference, compare, kiln_greedy
from test_batch import assert_batch_invariant

FLOOR, MISSES = 1e-9, 1e-6  # as tests/test_archs.py: the control's floor, and where a missing feature lands
SHAPE = dict(arch="qwen35", n_layer=8, n_embd=128, n_head=4, n_head_kv=2, head_dim=64, n_ff=256, seed=3)
MOE = dict(arch="qwen35moe", n_layer=4, n_ff=64, n_expert=8, n_expert_used=2)  # experts and a shared one
NEXT = dict(MOE, arch="qwen3next")  # interleaved head pairing; ssm_in and ssm_ba fused


def _ids(n: int, seed: int = 5) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(0, 49152, n)]


@pytest.fixture(scope="module")
def hybrid(tiny, smollm2):
    def make(wtype=Q.F32, **more):
        return tiny(**dict(SHAPE, **more), wtype=wtype, tokenizer_from=smollm2, types={"token_embd.weight": Q.F32})
    return make


@pytest.mark.llamacpp
def test_f32_logits_meet_llamacpp_at_the_floor(hybrid):
    path = hybrid()
    ids = _ids(70)
    a = compare(Reference(path, n_ctx=128).logits(ids), compiler.load(path, ctx=128, prefill_chunk=16)
                .prefill(ids, logits="all"))
    assert a.mean_kl < FLOOR and a.top1 == 1.0, a


@pytest.mark.llamacpp
def test_q8_0_logits_match_llamacpp(hybrid):
    path = hybrid(Q.Q8_0, n_layer=4, norm_mean=-0.7)
    ids = _ids(70)
    a = compare(Reference(path, n_ctx=128).logits(ids), compiler.load(path, ctx=128, prefill_chunk=16)
                .prefill(ids, logits="all"))
    assert a.mean_kl < 1e-6 and a.top1 == 1.0, a


def test_f32_logits_meet_the_float64_pass(hybrid):
    """tests/qwen35_reference.py: the model's math in float64 from llama.cpp's semantics, neither
    engine's code. kiln lands at the floor from it too."""
    path, ids = hybrid(n_layer=4), _ids(48)
    a = compare(forward(path, ids), compiler.load(path, ctx=128, prefill_chunk=16).prefill(ids, logits="all"))
    assert a.mean_kl < FLOOR and a.top1 == 1.0, a


# The float64 pass with one feature broken: kiln, which the test above holds at the floor, misses it
# by far, so that floor is what tells a broken feature (llama.cpp misses each by as much: 0.02 to 32)
BROKEN = {"decay": Variant(decay=False), "beta": Variant(beta=False), "conv": Variant(conv=False),
          "silu(z) gate": Variant(z_gate=False), "attention output gate": Variant(attn_gate=False),
          "rope over the whole head": Variant(rope_dims=SHAPE["head_dim"]),
          "heads paired h // ratio": Variant(interleaved_heads=True)}


@pytest.mark.parametrize("feature", list(BROKEN))
def test_each_feature_broken_in_the_float64_pass_misses_kiln(hybrid, feature):
    path, ids = hybrid(n_layer=4), _ids(48)
    b = compare(forward(path, ids, BROKEN[feature]),
                compiler.load(path, ctx=128, prefill_chunk=16).prefill(ids, logits="all"))
    assert b.mean_kl > MISSES, (feature, b)


# Each feature switched off in the file kiln runs, while llama.cpp runs the real model
OFF = {
    "decay": dict(fill={".ssm_a": (0.0,)}),  # A = 0: e^0, nothing decays
    "beta": dict(fill={"ssm_beta.weight": (0.0,)}),  # a constant write strength, sigmoid(0)
    "conv": dict(fill={"ssm_conv1d.weight": (0.0, 0.0, 0.0, 1.0)}),  # each channel its own input alone
    "partial rope": dict(n_rot=SHAPE["head_dim"], rope_sections=(11, 11, 10, 0)),  # every dim rotates
}


@pytest.mark.llamacpp
@pytest.mark.parametrize("feature", list(OFF))
def test_each_feature_moves_the_logits_past_the_floor(hybrid, feature):
    ids = _ids(70)
    ref = Reference(hybrid(), n_ctx=128).logits(ids)
    b = compare(ref, compiler.load(hybrid(**OFF[feature]), ctx=128, prefill_chunk=16).prefill(ids, logits="all"))
    assert b.mean_kl > MISSES, (feature, b)


@pytest.mark.llamacpp
@pytest.mark.parametrize("arch", ["qwen35", "qwen35moe", "qwen3next"])
def test_greedy_tokens_match_llamacpp(hybrid, arch):
    path = hybrid() if arch == "qwen35" else hybrid(**dict(MOE, arch=arch))
    ref, kiln = Reference(path, n_ctx=128), compiler.load(path, ctx=128, prefill_chunk=16)
    ids = ref.tokenize("Once upon a time, in a small village at the edge of a forest,")
    assert kiln_greedy(kiln, ids, 32) == ref.greedy(ids, 32)


def test_batch_chunk_and_thread_invariance_is_bitwise(hybrid):
    """Decoded alone, prefilled in chunks of 16, 3 and 17 beside another sequence's rows in both
    orders, with another thread count: the same bits (tests/test_batch.py)."""
    m = compiler.load(hybrid(Q.Q8_0), ctx=256, n_seq=4, prefill_chunk=16, batch_tokens=24, page_size=8)
    assert_batch_invariant(m, n=120)


def test_the_state_is_planned_per_sequence_and_shown(hybrid):
    n_seq = 3
    lay = plan(hybrid(), CompileOptions(ctx=256, n_seq=n_seq, page_size=16)).layout
    ssm = lay.config.hparams.ssm
    conv, delta = (4 * n for n in ssm.state_floats())
    recurrent = [ly.layer for ly in lay.state.layers]
    assert recurrent == [0, 1, 2, 4, 5, 6] and [ly.layer for ly in lay.kv.layers] == [3, 7]
    assert lay.state.slot_bytes >= len(recurrent) * (conv + delta) and lay.state_bytes == n_seq * lay.state.slot_bytes
    state = {b.name: b for b in lay.region("state")}
    assert state["delta_state-4"].size == delta and state["conv_state-4"].shape == (ssm.d_conv - 1, ssm.conv_dim)
    spans = sorted((b.offset, b.offset + b.size) for b in state.values())
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:])), "a slot's parts overlap"
    longer = plan(hybrid(), CompileOptions(ctx=1024, n_seq=n_seq, page_size=16)).layout
    assert longer.state.slot_bytes == lay.state.slot_bytes and longer.kv.total_bytes > lay.kv.total_bytes
    # the map shows it: its text, its JSON, its drawing
    from compiler.planner.reports.html import render_html
    from compiler.planner.reports.text import layout_dict, render_text
    text, js, html = render_text(lay), layout_dict(lay), render_html(lay)
    assert f"RECURRENT STATE (a slot of {lay.state.slot_bytes:,} bytes per sequence, {n_seq} slot(s)" in text
    assert "delta_state-6" in text and "recurrent_layers RRRARRRA" in text
    assert js["totals"]["state_bytes"] == lay.state_bytes and len(js["recurrent_state"]["layers"]) == 6
    assert f"slot(s) of {lay.state.slot_bytes:,} bytes, one a sequence" in html and "delta_state-6" in html


def test_fork_copies_the_state_and_save_carries_it(hybrid, tmp_path):
    m = compiler.load(hybrid(Q.Q8_0), ctx=256, n_seq=3, prefill_chunk=16)
    ids, more = _ids(40, 1), _ids(10, 2)
    with m.sequence() as a:
        a.prefill(ids)
        want = a.prefill(more, logits="all")
    with m.sequence() as a:
        a.prefill(ids)
        b = a.fork()
        a.prefill(_ids(5, 9))  # the parent moves on; the child's state is its own copy
        assert np.array_equal(b.prefill(more, logits="all"), want)
        b.close()
    with m.sequence() as a:
        a.prefill(ids)
        a.save(tmp_path / "s.kv")
    with m.sequence() as other:  # the slot the saved sequence had now holds another sequence's state
        other.prefill(_ids(30, 7))
    with m.sequence_from(tmp_path / "s.kv") as c:
        assert np.array_equal(c.prefill(more, logits="all"), want)


def test_positions_cannot_leave_a_recurrent_state(hybrid):
    m = compiler.load(hybrid(Q.Q8_0), ctx=256, prefill_chunk=16)
    with m.sequence() as s:
        first = s.prefill(_ids(20, 1))
        with pytest.raises(ModelError, match="qwen35 is a hybrid.*rollback"):
            s.rollback(10)
        with pytest.raises(ModelError, match="qwen35 is a hybrid"):
            s.shift(sinks=4, n_discard=8)
        assert s.n_past == 20
        s.rollback(20)  # keeping every position is no change
        s.reset()  # starting again is: row 0 starts from zeros
        assert np.array_equal(s.prefill(_ids(20, 1)), first)


# -- qwen35moe: the same hybrid, each FFN a mixture of experts and a shared expert ---------------------------
@pytest.mark.llamacpp
def test_moe_logits_meet_llamacpp_and_miss_it_without_the_shared_expert(hybrid):
    """The shared expert's gate is one logit a row (ffn_gate_inp_shexp), sigmoid-ed; with it zero the
    expert still adds half of itself, with its down projection zero it adds nothing: that misses."""
    ids = _ids(70)
    ref = Reference(hybrid(**MOE), n_ctx=128).logits(ids)
    a = compare(ref, compiler.load(hybrid(**MOE), ctx=128, prefill_chunk=16).prefill(ids, logits="all"))
    assert a.mean_kl < FLOOR and a.top1 == 1.0, a
    for off in ("ffn_down_shexp.weight", "ffn_gate_inp_shexp.weight"):
        b = compare(ref, compiler.load(hybrid(**MOE, fill={off: (0.0,)}), ctx=128, prefill_chunk=16)
                    .prefill(ids, logits="all"))
        assert b.mean_kl > MISSES, (off, b)


def test_moe_batch_chunk_and_thread_invariance_is_bitwise(hybrid):
    m = compiler.load(hybrid(Q.Q8_0, **MOE), ctx=256, n_seq=4, prefill_chunk=16, batch_tokens=24, page_size=8)
    assert_batch_invariant(m, n=120)


# -- qwen3next: value heads read their key heads in runs; q, k, v, z and b, a fused, grouped by key head --
@pytest.mark.llamacpp
def test_qwen3next_logits_meet_llamacpp_and_miss_it_with_qwen35s_pairing(hybrid):
    """The same file read as qwen35moe (general.architecture rewritten, so kiln's template pairs value
    head h with key head h % n_k) misses: the pairing is what the floor tells."""
    ids = _ids(70)
    ref = Reference(hybrid(**NEXT), n_ctx=128).logits(ids)
    a = compare(ref, compiler.load(hybrid(**NEXT), ctx=128, prefill_chunk=16).prefill(ids, logits="all"))
    assert a.mean_kl < FLOOR and a.top1 == 1.0, a
    modulo = hybrid(**NEXT, metadata_arch="qwen35moe")
    b = compare(ref, compiler.load(modulo, ctx=128, prefill_chunk=16).prefill(ids, logits="all"))
    assert b.mean_kl > MISSES, b


def test_qwen3next_batch_chunk_and_thread_invariance_is_bitwise(hybrid):
    m = compiler.load(hybrid(Q.Q8_0, **NEXT), ctx=256, n_seq=4, prefill_chunk=16, batch_tokens=24, page_size=8)
    assert_batch_invariant(m, n=120)


# -- prefix reuse: whole-state snapshots (compiler/serving/state_cache.py) -----------------------------------
def _conversation(m, turns: int, snapshots: bool):
    """A conversation of `turns` turns through the engine, each a new message of 20 tokens after the
    whole history (the last prompt and its 6 greedy tokens): each turn's tokens, their logprobs,
    and how many of its prompt came from a snapshot."""
    import threading

    from compiler.runtime.sampling import SamplingParams
    from compiler.serving.engine import Engine
    from compiler.serving.state_cache import Snapshots
    from compiler.serving.types import Request

    engine = Engine(m, prefix_cache=snapshots, snapshots=Snapshots(interval=32, budget_bytes=64 << 20)).start()
    history, out = [], []
    try:
        for turn in range(turns):
            events, done = [], threading.Event()

            def emit(e):
                events.append(e)
                if e.finish_reason or e.error:
                    done.set()
            prompt = history + _ids(20, 100 + turn)
            engine.submit(Request(prompt, SamplingParams(temperature=0.0), 6, [], emit, logprobs=2, ignore_eos=True))
            assert done.wait(120) and events[-1].finish_reason == "length", events[-1]
            tokens = [e.token for e in events if e.token is not None]
            out.append((tokens, [e.logprob for e in events if e.logprob is not None], events[-1].usage.cached_tokens))
            history = prompt + tokens
            # another client's request between turns: the sequence slot the next turn restores into
            # holds its state, not the conversation's
            other = threading.Event()
            engine.submit(Request(_ids(30, 900 + turn), SamplingParams(temperature=0.0), 2, [],
                                  lambda e: (e.finish_reason or e.error) and other.set(), ignore_eos=True))
            assert other.wait(120)
        return out, engine
    finally:
        engine.stop()


def test_a_conversation_restores_its_last_turn_and_is_bitwise_a_cold_run(hybrid):
    """Eight turns: from the second on, a turn restores the snapshot its previous request left (the
    whole history but the last token generated, which was never fed back) and prefills only that
    token and its new message; every token and logprob is what a server without snapshots gives."""
    m = compiler.load(hybrid(Q.Q8_0), ctx=512, n_seq=2, page_size=16, prefill_chunk=64)
    warm, engine = _conversation(m, 8, snapshots=True)
    cold, _ = _conversation(m, 8, snapshots=False)
    assert [(t, lp) for t, lp, _ in warm] == [(t, lp) for t, lp, _ in cold]
    for turn, (_, _, cached) in enumerate(warm):  # the history is 26 tokens a turn; all but the last came back
        assert cached == max(0, 26 * turn - 1), (turn, cached)
    assert engine.metrics.snapshot_hits._value.get() == 7 and engine.metrics.snapshot_misses._value.get() == 9
    assert engine.states.bytes > 0 and all(c == 0 for _, _, c in cold)
    from prometheus_client import generate_latest
    scraped = generate_latest(engine.metrics.registry).decode()  # what GET /metrics serves
    for line in ("kiln_state_snapshot_hits_total 7.0", "kiln_state_snapshot_misses_total 9.0"):
        assert line in scraped, line
    held = {k: float(v) for k, v in (ln.split() for ln in scraped.splitlines()
                                     if ln.startswith(("kiln_state_snapshot_bytes ", "kiln_state_snapshots ")))}
    assert held["kiln_state_snapshot_bytes"] > 0 and held["kiln_state_snapshots"] >= 8, held  # as last published


# -- speculation: the state saved before a step with drafts, the accepted tokens run again after --------------
def test_speculation_on_a_hybrid_is_plain_greedy(hybrid, monkeypatch):
    """Every step drafts its most (most then fail part way): each failure restores the state saved
    before the step and runs the kept tokens again, so the text and the tokens held are plain
    greedy decoding's (tests/test_speculative.py's check)."""
    from compiler.runtime.speculation import DraftLength
    from test_speculative import _check_exact

    monkeypatch.setattr(DraftLength, "choose", lambda self, *a, **k: self.max_draft)
    # a tied head makes random weights repeat themselves, which gives prompt lookup drafts to make
    m = compiler.load(hybrid(Q.Q8_0, untied=False), ctx=512, n_seq=4, prefill_chunk=64, threads=1)
    _check_exact(m, speculative="ngram", max_draft=6)


# -- the kernels: each SIMD spelling against its scalar reference, bit for bit ---------------------------------
@pytest.mark.parametrize("d", [128, 48, 40, 37])  # blocks of 16, a last block of 8, a tail
def test_delta_net_kernel_is_its_reference_bit_for_bit(d):
    """kiln_delta_net (one pass over a state row for its decay and k dot, one for its update and q dot,
    AVX2 where built) against kiln_delta_net_ref (a loop and vec_f32.h's reference dot each): the same
    bits, over rows of two sequences, one starting at cache row 0 and one continuing its state; and
    against the rule in float64 (tests/qwen35_reference.py's order of operations) within float32's reach."""
    from compiler.build.runtime import runtime_kernels
    K = runtime_kernels()
    rng = np.random.default_rng(d)
    n_k, n_v, n = 2, 4, 6
    x = rng.standard_normal((n, (2 * n_k + n_v) * d)).astype(np.float32)
    alpha, beta = (rng.standard_normal((n, n_v)).astype(np.float32) for _ in range(2))
    dt, a = rng.standard_normal(n_v).astype(np.float32), -rng.uniform(0.1, 2, n_v).astype(np.float32)
    seq, row = np.array([0, 1, 0, 1, 0, 1], np.int32), np.array([0, 5, 1, 6, 2, 7], np.int32)
    slot = n_v * d * d
    start = rng.standard_normal(2 * slot).astype(np.float32)
    outs, states = [], []
    for fn in (K.lib.kiln_delta_net, K.lib.kiln_delta_net_ref):
        out, state = np.zeros((n, n_v, d), np.float32), start.copy()
        ptr = lambda v, t="float *": K.ffi.cast(t, v.ctypes.data)  # noqa: E731
        fn(ptr(out), ptr(x), ptr(alpha), ptr(beta), ptr(dt), ptr(a), ptr(seq, "int32_t *"), ptr(row, "int32_t *"),
           n, n_k, n_v, 0, d, 1e-6, ptr(state), slot, 0, n_v)
        outs.append(out), states.append(state)
    assert np.array_equal(outs[0], outs[1]) and np.array_equal(states[0], states[1])
    # the rule in float64, sequence 1 continuing `start`, sequence 0 from zeros
    S = {0: np.zeros((n_v, d, d)), 1: start[slot:].astype(np.float64).reshape(n_v, d, d)}
    for r in range(n):
        xr = x[r].astype(np.float64)
        for h in range(n_v):
            kh = h % n_k
            q, k = xr[kh * d:(kh + 1) * d], xr[(n_k + kh) * d:(n_k + kh + 1) * d]
            q, k = q / np.sqrt((q * q).sum() + 1e-6), k / np.sqrt((k * k).sum() + 1e-6)
            v = xr[(2 * n_k + h) * d:(2 * n_k + h + 1) * d]
            decay = np.exp(np.log1p(np.exp(float(alpha[r, h]) + float(dt[h]))) * float(a[h]))
            b = 1 / (1 + np.exp(-float(beta[r, h])))
            M = S[seq[r]][h]  # [j][i]: value dim j, key dim i
            M *= decay
            M += np.outer((v - M @ k) * b, k)
            np.testing.assert_allclose(outs[0][r, h], M @ q / np.sqrt(d), rtol=2e-4, atol=2e-5)


def test_ssm_conv_kernel_is_the_rule_and_keeps_its_window():
    """kiln_ssm_conv against the rule (each channel's window oldest first, then SiLU), row by row of
    two sequences, one starting at cache row 0; its window after is the last taps - 1 inputs."""
    from compiler.build.runtime import runtime_kernels
    K = runtime_kernels()
    rng = np.random.default_rng(3)
    n, c, taps = 5, 40, 4
    x, w = rng.standard_normal((n, c)).astype(np.float32), rng.standard_normal((c, taps)).astype(np.float32)
    seq, row = np.array([0, 1, 0, 0, 1], np.int32), np.array([0, 9, 1, 2, 10], np.int32)
    state = rng.standard_normal((2, taps - 1, c)).astype(np.float32)
    start = state.copy()
    y = np.zeros_like(x)
    ptr = lambda v, t="float *": K.ffi.cast(t, v.ctypes.data)  # noqa: E731
    K.lib.kiln_ssm_conv(ptr(y), ptr(x), ptr(w), ptr(seq, "int32_t *"), ptr(row, "int32_t *"), n, c, taps, ptr(state),
                        (taps - 1) * c, 0, c)
    window = {0: np.zeros((taps - 1, c)), 1: start[1].astype(np.float64)}
    for r in range(n):
        full = np.vstack([window[seq[r]], x[r:r + 1].astype(np.float64)])
        s = (full * w.T.astype(np.float64)).sum(0)
        np.testing.assert_allclose(y[r], s / (1 + np.exp(-s)), rtol=1e-5, atol=1e-6)
        window[seq[r]] = full[1:]
    for s_ in (0, 1):
        np.testing.assert_array_equal(state[s_], window[s_].astype(np.float32))


def test_the_server_speculates_on_a_hybrid_and_answers_as_plain_decoding(hybrid, monkeypatch):
    """kiln serve --spec ngram's scheduler on a hybrid: a step with drafts saves each drafting
    request's state, a failed draft rewinds it and runs the kept rows again; every answer is plain
    greedy decoding's, while drafts were made, accepted and rejected."""
    import threading

    from compiler.runtime.sampling import SamplingParams
    from compiler.runtime.speculation import DraftLength, Speculation
    from compiler.serving.engine import Engine
    from compiler.serving.types import Request

    monkeypatch.setattr(DraftLength, "choose", lambda self, *a, **k: self.max_draft)
    m = compiler.load(hybrid(Q.Q8_0, untied=False), ctx=512, n_seq=4, prefill_chunk=64, threads=1)
    prompts = [m.tokenize(t) for t in ("Count: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,",
                                       "Once upon a time, in a small village by the sea,",
                                       "the the the cat the cat the cat the")]
    want = []
    for p in prompts:
        m.reset()
        want.append(m.tokenize(m.generate(p, max_tokens=40, temperature=0), add_special=False, parse_special=False))
    m.reset()
    engine = Engine(m, speculation=Speculation.of(m, "ngram", None, 6)).start()
    try:
        got, done = [[] for _ in prompts], [threading.Event() for _ in prompts]
        for i, p in enumerate(prompts):
            def emit(e, i=i):
                if e.token is not None:
                    got[i].append(e.token)
                if e.finish_reason or e.error:
                    done[i].set()
            engine.submit(Request(p, SamplingParams(temperature=0.0), 40, [], emit, speculative=True))
        assert all(d.wait(300) for d in done)
    finally:
        engine.stop()
    for g, w, p in zip(got, want, prompts):
        assert m.detokenize(g) == m.detokenize(w), p
    drafted, accepted = engine.metrics.spec.drafted, engine.metrics.spec.accepted
    assert drafted > accepted > 0, (drafted, accepted)
