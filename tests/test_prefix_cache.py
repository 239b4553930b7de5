"""The radix prefix cache over the paged pool: a hit gives the cold run's logits bit for bit,
the sliding-window rule, LRU eviction of unlocked leaves, and the C calls' refusals."""
from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

import compiler
from compiler.runtime import ModelError
from compiler.serving.radix_cache import RadixCache

PAGE = 16


def _ids(n: int, seed: int, vocab: int = 259) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(0, vocab, n)]


@pytest.fixture(scope="module")
def smol(smollm2):
    return compiler.load(smollm2, ctx=512, n_seq=4, page_size=PAGE, prefill_chunk=64)


@pytest.fixture(scope="module")
def gemma_tiny(tiny, smollm2):  # 5 sliding layers with a window of 8 to one global layer, pages of 8
    path = tiny("gemma3", wtype=Q.Q8_0, n_layer=6, n_embd=128, n_head=4, n_head_kv=1, head_dim=64, n_ff=256,
                sliding_window=8, tokenizer_from=smollm2)
    return compiler.load(path, ctx=96, n_seq=4, page_size=8, prefill_chunk=4)


def _cold(m, ids):
    with m.sequence() as s:
        return s.prefill(ids)


def _warm(m, cache, ids):
    held = cache.match(ids)
    with m.sequence(held.pages, held.tokens) as s:
        assert s.n_past == len(held.tokens)
        logits = s.prefill(ids[len(held.tokens):])
    cache.release(held)
    return logits, len(held.tokens)


def test_a_hit_gives_the_cold_logits_bit_for_bit(smol):
    cache = RadixCache(smol)
    shared = _ids(100, 1, smol.n_vocab)
    with smol.sequence() as a:
        a.prefill(shared + _ids(7, 2, smol.n_vocab))
        cache.release(cache.insert(a, cache.match([])))
    assert cache.pages_held == 6  # the 107 positions fill 6 pages of 16
    ids = shared + _ids(30, 3, smol.n_vocab)
    logits, cached = _warm(smol, cache, ids)
    assert cached == 96
    assert np.array_equal(logits, _cold(smol, ids))
    # the whole prompt cached: the last page is run again, for the logits
    logits, cached = _warm(smol, cache, shared[:96])
    assert cached == 80 and np.array_equal(logits, _cold(smol, shared[:96]))
    cache.clear()
    assert smol.kv_stats()["pages_used"] == 0


def test_sliding_window_prefix_counts_only_where_its_window_is_held(gemma_tiny):
    m = gemma_tiny
    cache = RadixCache(m)
    ids = _ids(40, 4)
    with m.sequence() as a:
        a.prefill(ids)
        cache.release(cache.insert(a, cache.match([])))
    # the sliding group kept only the pages the next query (at 40) reads: blocks 4 (positions 32..39)
    node = next(iter(cache.root.children.values()))
    assert list(node.pages[:, 1] >= 0) == [False, False, False, False, True]
    longer = ids + _ids(9, 5)
    logits, cached = _warm(m, cache, longer)
    assert cached == 40 and np.array_equal(logits, _cold(m, longer))
    # diverging at 20: a query at 16 reads positions 9..15 of block 1, which the sliding layers let go
    forked = ids[:20] + _ids(5, 6)
    logits, cached = _warm(m, cache, forked)
    assert cached == 0 and np.array_equal(logits, _cold(m, forked))
    # C refuses the same prefix handed over by hand
    with pytest.raises(ModelError, match="sliding-window"):
        m.sequence(node.pages[:2], ids[:16])
    cache.clear()
    assert m.kv_stats()["pages_used"] == 0


def test_eviction_takes_least_recently_used_unlocked_leaves(smol):
    cache = RadixCache(smol)
    prompts = [_ids(40, 10 + i, smol.n_vocab) for i in range(3)]
    for p in prompts:
        with smol.sequence() as s:
            s.prefill(p)
            cache.release(cache.insert(s, cache.match([])))
    assert cache.pages_held == 6 and smol.kv_stats()["pages_used"] == 6
    held = cache.match(prompts[0] + [1])  # locks the first; the second is now the least recently used
    assert len(held.tokens) == 32
    cache.release(cache.match(prompts[2] + [1]))
    assert cache.evict(1) == 2  # one leaf: the second prompt's two pages
    assert len(cache.match(prompts[1] + [1]).tokens) == 0
    assert smol.kv_stats()["pages_used"] == 4
    assert cache.evict(100) == 2  # the third; the first is locked
    assert len(cache.root.children) == 1
    cache.release(held)
    assert cache.evict(100) == 2 and smol.kv_stats()["pages_used"] == 0


def test_shared_pages_outlive_the_sequence_and_are_checked(smol):
    ids = _ids(48, 20, smol.n_vocab)
    with smol.sequence() as s:
        s.prefill(ids)
        pages = s.share(0, 3)
        with pytest.raises(ModelError, match="invalid argument"):
            s.share(2, 2)  # block 3 is not full
    assert smol.kv_stats()["pages_used"] == 3
    with smol.sequence(pages, ids) as t:
        assert np.array_equal(t.decode(5), _cold(smol, ids + [5]))
        with pytest.raises(ModelError):
            smol.sequence(pages, ids[:10])  # 3 pages hold 48 positions
    with pytest.raises(ModelError, match="invalid argument"):
        smol.release_pages(np.concatenate([pages[:1], pages[:1]]))  # the same page twice
    smol.release_pages(pages)
    with pytest.raises(ModelError, match="invalid argument"):
        smol.release_pages(pages)  # no longer held
    assert smol.kv_stats()["pages_used"] == 0
