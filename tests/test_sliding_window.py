"""Sliding-window layers as ring buffers: every edge case agrees with token-by-token decoding.

A tiny Gemma 3 (6 layers: 5 local with a window of 8, 1 global) with a prefill chunk of 4
gives rings of 8 + 4 - 1 = 11 rows, so a few dozen tokens wrap them many times.
"""
from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

import compiler
from compiler.model import ModelError

WINDOW, CHUNK = 8, 4


@pytest.fixture(scope="module")
def gemma_tiny(tiny, smollm2):
    return tiny("gemma3", wtype=Q.Q8_0, n_layer=6, n_embd=128, n_head=4, n_head_kv=1, head_dim=64, n_ff=256,
                sliding_window=WINDOW, tokenizer_from=smollm2)


def _load(path):
    return compiler.load(path, ctx=96, prefill_chunk=CHUNK)


def _stepwise(path, ids):
    m = _load(path)
    return np.stack([m.decode(int(t)) for t in ids])


def _ids(n, seed=0):
    return [int(t) for t in np.random.default_rng(seed).integers(0, 259, n)]


def test_rings_are_window_plus_chunk_minus_one(gemma_tiny):
    kv = _load(gemma_tiny).compiled.decode.layout.kv
    assert [ly.capacity for ly in kv.layers] == [WINDOW + CHUNK - 1] * 5 + [96]


@pytest.mark.parametrize("n", [WINDOW, WINDOW + 1, 5 * WINDOW + 3], ids=["window", "window+1", "long"])
def test_chunked_prefill_matches_decode(gemma_tiny, n):
    ids = _ids(n)
    np.testing.assert_allclose(_load(gemma_tiny).prefill(ids, logits="all"), _stepwise(gemma_tiny, ids),
                               rtol=1e-4, atol=1e-5)


def test_long_prompt_then_decode(gemma_tiny):
    ids = _ids(45, seed=1)
    m = _load(gemma_tiny)
    m.prefill(ids[:37])
    tail = np.stack([m.decode(t) for t in ids[37:]])
    np.testing.assert_allclose(tail, _stepwise(gemma_tiny, ids)[37:], rtol=1e-4, atol=1e-5)


def test_rollback_across_the_wrap_point(gemma_tiny):
    m = _load(gemma_tiny)
    ids, other = _ids(30, seed=2), _ids(6, seed=3)
    m.prefill(ids)
    assert m._lib.kiln_rollback_limit() == CHUNK
    m.rollback(27)  # rows 27..29 were written over the ring's oldest rows; 27 - 8 + 1 .. 26 are intact
    got = m.prefill(other, logits="all")
    np.testing.assert_allclose(got, _stepwise(gemma_tiny, ids[:27] + other)[27:], rtol=1e-4, atol=1e-5)


def test_rollback_further_than_the_ring_remembers_is_refused(gemma_tiny):
    m = _load(gemma_tiny)
    m.prefill(_ids(30, seed=4))
    with pytest.raises(ModelError, match="further back than the sliding-window rings remember"):
        m.rollback(20)
    assert m.n_past == 30
    m.rollback(0)  # back to nothing is always possible: no ring row is needed
    assert m.n_past == 0
    m.prefill(_ids(20, seed=4))
    with pytest.raises(ModelError, match="sliding-window rings"):
        m.rollback(3)  # a short prefix still needs positions 0..2, which the 11-row rings overwrote
    m.rollback(17)  # needs 10..16; the rings hold 9..19
    assert m.n_past == 17


def test_generate_falls_back_to_a_fresh_prefill(gemma_tiny):
    m = _load(gemma_tiny)
    first = _ids(30, seed=5)
    m.prefill(first)
    second = first[:10] + _ids(5, seed=6)
    m.generate(second, max_tokens=2, temperature=0)  # shares 10 tokens, but 20 back is beyond the rings
    assert m.tokens[:len(second)] == second and m.n_past == len(second) + 1
    fresh = _load(gemma_tiny)
    assert m.tokens[len(second)] == int(fresh.prefill(second).argmax())  # the same greedy token as a clean start
