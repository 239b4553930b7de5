"""Sliding-window layers in pages that leave the window: every edge case agrees with
token-by-token decoding.

A tiny Gemma 3 (6 layers: 5 local with a window of 8, 1 global) with pages of 8 positions and
a prefill chunk of 4: a sequence holds at most ceil((8 + 4 - 2) / 8) + 1 = 3 pages of its
sliding layers, so a few dozen tokens send pages back to the pool many times.
"""
from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

import compiler
from compiler.runtime import ModelError

WINDOW, CHUNK, PAGE = 8, 4, 8


@pytest.fixture(scope="module")
def gemma_tiny(tiny, smollm2):
    return tiny("gemma3", wtype=Q.Q8_0, n_layer=6, n_embd=128, n_head=4, n_head_kv=1, head_dim=64, n_ff=256,
                sliding_window=WINDOW, tokenizer_from=smollm2)


def _load(path):
    return compiler.load(path, ctx=96, prefill_chunk=CHUNK, page_size=PAGE)


def _stepwise(path, ids):
    m = _load(path)
    return np.stack([m.decode(int(t)) for t in ids])


def _ids(n, seed=0):
    return [int(t) for t in np.random.default_rng(seed).integers(0, 259, n)]


def test_sliding_layers_hold_the_window_plus_a_chunk(gemma_tiny):
    kv = _load(gemma_tiny).compiled.planned.layout.kv
    full, sliding = kv.groups
    assert full.layers == (5,) and full.seq_pages == 96 // PAGE
    assert sliding.layers == (0, 1, 2, 3, 4) and sliding.seq_pages == 3


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
    m.rollback(27)  # the next query reads 20..26: pages 2 and 3 are still held
    got = m.prefill(other, logits="all")
    np.testing.assert_allclose(got, _stepwise(gemma_tiny, ids[:27] + other)[27:], rtol=1e-4, atol=1e-5)


def test_rollback_further_than_the_ring_remembers_is_refused(gemma_tiny):
    m = _load(gemma_tiny)
    m.prefill(_ids(30, seed=4))
    with pytest.raises(ModelError, match="further back than the sliding-window layers' pages remember"):
        m.rollback(20)
    assert m.n_past == 30
    m.rollback(0)  # back to nothing is always possible: no page is needed
    assert m.n_past == 0
    m.prefill(_ids(20, seed=4))
    with pytest.raises(ModelError, match="sliding-window layers' pages"):
        m.rollback(3)  # a short prefix still needs positions 0..2, whose page went back to the pool
    m.rollback(17)  # needs 10..16: pages 1 and 2 are held
    assert m.n_past == 17


def test_generate_falls_back_to_a_fresh_prefill(gemma_tiny):
    m = _load(gemma_tiny)
    first = _ids(30, seed=5)
    m.prefill(first)
    second = first[:10] + _ids(5, seed=6)
    m.generate(second, max_tokens=2, temperature=0)  # shares 10 tokens, but their pages left the window
    assert m.tokens[:len(second)] == second and m.n_past == len(second) + 1
    fresh = _load(gemma_tiny)
    assert m.tokens[len(second)] == int(fresh.prefill(second).argmax())  # the same greedy token as a clean start
