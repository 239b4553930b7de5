"""Context shift (StreamingLLM, llama.cpp's --context-shift): seq.shift / seq.keep.

Parity: after the same shift, teacher-forced logits match llama.cpp doing llama_memory_seq_rm +
llama_memory_seq_add on the same GGUF (its keys re-rotated at the next decode)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

import compiler
from compiler.tools.kv_quality import DEFAULT_TEXT
from compiler.runtime import ModelError
from reference import Reference, compare

TEXT = DEFAULT_TEXT.read_text()


@pytest.fixture(scope="module")
def gemma_tiny_path(tiny, smollm2):
    """5 sliding layers of window 8 and a global one."""
    return tiny("gemma3", wtype=Q.Q8_0, n_layer=6, n_embd=128, n_head=4, n_head_kv=1, head_dim=64, n_ff=256,
                sliding_window=8, tokenizer_from=smollm2)


def shifted_logits(ref: Reference, kiln, ids: list[int], n0: int, sinks: int, n_discard: int, n_next: int):
    """Both engines read ids[:n0], shift, then read the next n_next tokens: their logits."""
    ref.reset()
    ref.feed(ids[:n0])
    ref.shift(sinks, n_discard)
    kiln.reset()
    kiln.prefill(ids[:n0])
    assert kiln.default_sequence.shift(sinks, n_discard) == n0 - n_discard
    nxt = ids[n0:n0 + n_next]
    return ref.extend(nxt), kiln.prefill(nxt, logits="all")


@pytest.mark.parametrize("kv_dtype", ["f32", "q8_0"])
def test_smollm2_shift_matches_llamacpp(smollm2, kv_dtype):
    ref = Reference(smollm2, n_ctx=256, kv_dtype=kv_dtype)
    kiln = compiler.load(smollm2, ctx=256, kv_dtype=kv_dtype)
    ids = ref.tokenize(TEXT)
    want, got = shifted_logits(ref, kiln, ids, 240, 4, 118, 100)
    a = compare(want, got)
    print(f"\nSmolLM2 {kv_dtype}, shift keep 4 discard 118: mean KL {a.mean_kl:.2e}, top-1 {a.top1:.1%}")
    assert a.mean_kl <= 5e-3 and a.top1 >= 0.92
    # the control: the same tokens prefilled afresh are a different cache, far from llama.cpp's
    kiln.reset()
    fresh = kiln.prefill(ids[:4] + ids[122:340], logits="all")[-100:]
    assert compare(want, fresh).mean_kl > 3 * a.mean_kl


def test_gemma3_shift_matches_llamacpp_with_a_full_swa_cache(gemma3):
    """kiln shifts Gemma 3 without keeping every sliding-window position: its sliding pages hold the
    window only. The result is llama.cpp's with --swa-full (which llama.cpp needs to shift at all)."""
    ref = Reference(gemma3, n_ctx=1024, kv_dtype="f32", swa_full=True)
    kiln = compiler.load(gemma3, ctx=1024)
    ids = ref.tokenize(TEXT)
    want, got = shifted_logits(ref, kiln, ids, 900, 4, 256, 100)
    a = compare(want, got)
    print(f"\nGemma 3 f32, shift keep 4 discard 256: mean KL {a.mean_kl:.2e}, top-1 {a.top1:.1%}")
    assert a.mean_kl <= 1e-2 and a.top1 >= 0.9  # unshifted, these positions sit at 8e-3 (Gemma's floor)


def test_sliding_window_shift_rules(gemma_tiny_path):
    """A window of 8: a shift whose window reaches back to sinks the sliding pages already let go
    is refused, changing nothing; one that keeps clear of them works and agrees with llama.cpp
    holding every position (--swa-full)."""
    kiln = compiler.load(gemma_tiny_path, ctx=64, prefill_chunk=16, page_size=8)
    ids = [int(t) for t in np.random.default_rng(3).integers(10, 4000, 60)]
    s = kiln.default_sequence
    s.prefill(ids[:40])
    with pytest.raises(ModelError, match="sliding-window layers"):
        s.shift(4, 30)  # the next query (at 10) would read positions 3..9: sink 3 left the window long ago
    assert s.n_past == 40
    ref = Reference(gemma_tiny_path, n_ctx=64, kv_dtype="f32", swa_full=True)
    want, got = shifted_logits(ref, kiln, ids, 40, 4, 18, 20)  # next query at 22 reads 15..21, all held
    a = compare(want, got)
    assert a.mean_kl <= 1e-4 and a.top1 == 1.0


def test_shifting_a_fork_leaves_the_parent_bit_identical(smollm2):
    m = compiler.load(smollm2, ctx=256, n_seq=3, kv_dtype="q8_0")
    ids = m.tokenize(TEXT)[:200]
    a, control = m.sequence(), m.sequence()
    a.prefill(ids)
    control.prefill(ids)
    b = a.fork()  # shares every page: the shift must copy what it writes
    b.shift(4, 100)
    assert b.n_past == 100 and b.tokens == ids[:4] + ids[104:]
    assert np.array_equal(a.decode(ids[0]), control.decode(ids[0]))


def test_quantized_shift_costs_what_the_cache_costs(smollm2):
    """A q4_0 cache is held in Hadamard blocks; a shift takes the keys out of them to rotate by
    position. Done right, the shifted q4_0 cache is as far from the shifted f32 one as the
    unshifted caches are from each other."""
    ids = compiler.load(smollm2, ctx=256).tokenize(TEXT)
    out = {}
    for dtype in ("f32", "q4_0"):
        m = compiler.load(smollm2, ctx=256, kv_dtype=dtype)
        plain = m.prefill(ids[:4] + ids[122:340], logits="all")[-100:]  # the shifted tokens, read afresh
        m.reset()
        m.prefill(ids[:240])
        m.default_sequence.shift(4, 118)
        out[dtype] = plain, m.prefill(ids[240:340], logits="all")
    unshifted, shifted = (compare(out["f32"][i], out["q4_0"][i]).mean_kl for i in (0, 1))
    assert shifted <= 2 * unshifted + 1e-2


def test_generation_goes_past_the_context_with_context_shift(smollm2):
    m = compiler.load(smollm2, ctx=128)
    prompt = m.tokenize(TEXT)[:40]
    out = m.generate(prompt, max_tokens=300, temperature=0, context_shift=True)
    assert len(m.tokenize(out, add_special=False)) >= 250 and m.n_past <= 128
    m.reset()
    assert len(m.tokenize(m.generate(prompt, max_tokens=300, temperature=0), add_special=False)) <= 90  # stops full


@pytest.mark.parametrize("call,match", [
    (lambda s: s.shift(-1), "sinks"), (lambda s: s.shift(4, 0), "n_discard"), (lambda s: s.shift(4, 97), "n_discard"),
    (lambda s: s.keep([3, 2]), "strictly increasing"), (lambda s: s.keep([0, 100]), "strictly increasing"),
])
def test_bad_shifts_are_refused_by_name(smollm2, call, match):
    m = compiler.load(smollm2, ctx=256)
    s = m.default_sequence
    s.prefill(m.tokenize(TEXT)[:100])
    with pytest.raises(ModelError, match=match):
        call(s)
    assert s.n_past == 100


def test_the_server_engine_shifts_a_full_sequence_and_keeps_its_pages_out_of_the_prefix_cache(smollm2):
    """kiln serve --context-shift: a request that outgrows the context goes on to max_tokens;
    its shifted pages never enter the prefix cache (they are not the prefix's cold pages)."""
    import threading

    from compiler.runtime.sampling import SamplingParams
    from compiler.serving.engine import Engine
    from compiler.serving.types import Request

    m = compiler.load(smollm2, ctx=128, n_seq=2, page_size=16)
    engine = Engine(m, context_shift=True, sinks=4).start()
    try:
        events, done = [], threading.Event()

        def emit(e):
            events.append(e)
            if e.finish_reason or e.error:
                done.set()

        prompt = m.tokenize(TEXT)[:40]
        engine.submit(Request(prompt, SamplingParams(temperature=0.0), 200, [], emit, ignore_eos=True))
        assert done.wait(120)
        assert events[-1].finish_reason == "length" and events[-1].usage.completion_tokens == 200
        assert engine.metrics.shifts._value.get() >= 2
        assert engine.cache.pages_held == 40 // 16  # the prompt's full pages, cached as it was read; nothing after
    finally:
        engine.stop()
