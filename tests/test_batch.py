"""Many sequences in one step: bitwise batch invariance, per-sequence operations on the paged
pool, page accounting, and the refusals.

Batch invariance is checked bit for bit: a token's logits must not depend on whether it was
decoded alone, in a prefill chunk of any size, beside other sequences' rows in any order, or
with another thread count.
"""
from __future__ import annotations

import os
import subprocess
import sys
import threading

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

import compiler
from compiler.runtime import Model, ModelError
from compiler.tools.synthetic_features import FEATURE_MODELS, FEATURE_SHAPE

KV_DTYPES = ["f32", "f16", "q8_0", "q4_0"]  # q4_0: K and V in Hadamard blocks


def _ids(n: int, vocab: int, seed: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(0, vocab, n)]


def assert_batch_invariant(m: Model, n: int = 150) -> None:
    """Every way of batching the same tokens gives the same bits."""
    ids, other = _ids(n, m.n_vocab, 1), _ids(n, m.n_vocab, 2)
    with m.sequence() as a:
        alone = np.stack([a.decode(t) for t in ids])
    with m.sequence() as b:  # chunks of the prefill chunk, every row's logits
        assert np.array_equal(b.prefill(ids, logits="all"), alone)
    for size in (3, 17):  # other chunk sizes, beside another sequence's rows, in both orders
        with m.sequence() as c, m.sequence() as d:
            d.prefill(other[:5])
            for i in range(0, n, size):
                items = [(c, ids[i:i + size]), (d, other[5 + i // size])]
                got = m.step(items if size == 3 else items[::-1])
                last = min(i + size, n) - 1
                assert np.array_equal(got[0 if size == 3 else 1], alone[last]), (size, i)
    with m.sequence() as e, m.sequence() as f:  # a step that wants no logits of one item, or of none
        e.prefill(ids[:-2]), f.prefill(other[:5])
        assert m.step([(e, ids[-2]), (f, other[5])], need=[False, False]).shape == (0, m.n_vocab)
        got = m.step([(f, other[6]), (e, ids[-1])], need=[False, True])
        assert got.shape == (1, m.n_vocab) and np.array_equal(got[0], alone[-1]) and f.n_past == 7
    threads = 1 if m.n_threads > 1 else 2  # another instance of the same library, another thread count
    other_m = Model(m.compiled, threads=threads)
    assert np.array_equal(other_m.prefill(ids, logits="all"), alone)


@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
def test_smollm2_batch_invariance_is_bitwise(smollm2, kv_dtype):
    assert_batch_invariant(compiler.load(smollm2, ctx=512, n_seq=4, kv_dtype=kv_dtype, prefill_chunk=64))


@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
def test_gemma3_batch_invariance_is_bitwise(gemma3, kv_dtype):
    assert_batch_invariant(compiler.load(gemma3, ctx=512, n_seq=4, kv_dtype=kv_dtype, prefill_chunk=64), n=120)


@pytest.fixture(scope="module")
def gemma_tiny(tiny, smollm2):
    """5 sliding layers of window 8 and a global one: pages of 8 leave the window every few tokens."""
    return tiny("gemma3", wtype=Q.Q8_0, n_layer=6, n_embd=128, n_head=4, n_head_kv=1, head_dim=64, n_ff=256,
                sliding_window=8, tokenizer_from=smollm2)


@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
def test_sliding_pages_batch_invariance_is_bitwise(gemma_tiny, kv_dtype):
    m = compiler.load(gemma_tiny, ctx=256, n_seq=4, kv_dtype=kv_dtype, prefill_chunk=16, batch_tokens=24,
                     page_size=8)
    assert_batch_invariant(m, n=200)


@pytest.mark.parametrize("name", list(FEATURE_MODELS))
def test_new_architectures_batch_invariance_is_bitwise(tiny, smollm2, name):
    """Scaled and factored ropes, soft-capped scores and logits, granite's scales, fused weights:
    each a per-row function, so batching changes no bit (K in Hadamard blocks too: q4_0)."""
    path = tiny(**dict(FEATURE_SHAPE, **FEATURE_MODELS[name]), wtype=Q.Q8_0, tokenizer_from=smollm2)
    for kv_dtype in ("f32", "q4_0"):
        assert_batch_invariant(compiler.load(path, ctx=256, n_seq=4, kv_dtype=kv_dtype, prefill_chunk=16,
                                             batch_tokens=24, page_size=8), n=120)


@pytest.fixture(scope="module")
def tiny_llama(tiny, smollm2):
    return tiny("llama", wtype=Q.Q8_0, tokenizer_from=smollm2)


def test_fork_shares_full_pages_and_copies_the_last_on_write(tiny_llama):
    m = compiler.load(tiny_llama, ctx=256, n_seq=4, page_size=16, prefill_chunk=32)
    ids = _ids(70, m.n_vocab, 3)
    a = m.sequence()
    a.prefill(ids)
    assert m.kv_stats()["pages_used"] == 5  # 70 positions in pages of 16
    b = a.fork()
    assert b.n_past == 70 and m.kv_stats()["pages_used"] == 5  # every page shared
    la, lb = a.decode(7), b.decode(7)
    assert np.array_equal(la, lb)
    assert m.kv_stats()["pages_used"] == 6  # the partly filled fifth page was copied for one of them
    b.rollback(20)  # into a shared full page: the next write copies it, a keeps its own
    b.decode(9)
    with m.sequence() as fresh:
        fresh.prefill(ids + [7])
        assert np.array_equal(a.decode(11), fresh.decode(11))
    b.close()
    a.close()
    assert m.kv_stats()["pages_used"] == 0


def test_pages_follow_the_tokens_and_all_return(tiny_llama):
    m = compiler.load(tiny_llama, ctx=2048, n_seq=8, page_size=64, prefill_chunk=256)
    lengths = list(range(100, 1600, 200))  # 100, 300, ..., 1500
    seqs = [m.sequence() for _ in lengths]
    for s, n in zip(seqs, lengths):
        s.prefill(_ids(n, m.n_vocab, n))
    stats = m.kv_stats()
    assert stats["pages_used"] == sum(-(-n // 64) for n in lengths)
    assert stats["tokens_cached"] == sum(lengths) and stats["sequences"] == 8
    for s in seqs:
        s.close()
    stats = m.kv_stats()
    assert stats["pages_used"] == 0 and stats["pages_free"] == stats["pages_total"] and stats["sequences"] == 0


def test_sliding_layers_hold_only_their_window(gemma_tiny):
    m = compiler.load(gemma_tiny, ctx=512, n_seq=2, page_size=8, prefill_chunk=16)
    kv = m.compiled.planned.layout.kv
    full, sliding = kv.groups
    assert sliding.window == 8 and sliding.seq_pages == -(-(8 + 16 - 2) // 8) + 1
    with m.sequence() as s:
        s.prefill(_ids(300, m.n_vocab, 4))
        groups = m.kv_stats()["groups"]
        assert groups[0]["pages_used"] == -(-300 // 8)
        assert groups[1]["pages_used"] <= 2  # positions 293..299 the next token reads, in at most 2 pages
        with pytest.raises(ModelError, match="sliding-window"):
            s.rollback(100)  # those pages went back to the pool
        s.rollback(296)  # still held
    assert m.kv_stats()["pages_used"] == 0


def test_exhausted_pool_is_refused_and_changes_nothing(tiny_llama):
    m = compiler.load(tiny_llama, ctx=256, n_seq=3, page_size=16, kv_pages=6, prefill_chunk=32)
    a, b = m.sequence(), m.sequence()
    a.prefill(_ids(64, m.n_vocab, 5))  # 4 pages
    before = m.kv_stats()
    with pytest.raises(ModelError, match=r"out of pages.*--kv-pages"):
        b.prefill(_ids(40, m.n_vocab, 6))  # 3 more: only 2 free
    assert m.kv_stats() == before and b.n_past == 0
    with pytest.raises(ModelError, match=r"out of pages"):
        m.step([(a, 1), (b, _ids(31, m.n_vocab, 7))])  # a fits, b does not: neither moves
    assert m.kv_stats() == before and a.n_past == 64
    a.close()
    b.prefill(_ids(40, m.n_vocab, 6))
    assert b.n_past == 40


def test_sequence_refusals_name_the_option(tiny_llama):
    m = compiler.load(tiny_llama, ctx=64, n_seq=2, page_size=16, prefill_chunk=8)
    a, b = m.sequence(), m.sequence()
    with pytest.raises(ModelError, match=r"all 2 sequences are open.*--n-seq"):
        m.sequence()
    b.close()
    with pytest.raises(ModelError, match="sequence 1 is closed"):
        b.decode(1)
    with pytest.raises(ModelError, match=r"1 to 8 rows.*--batch-tokens.*got 0"):
        m.step([])
    with pytest.raises(ModelError, match=r"1 to 8 rows.*--batch-tokens.*got 9"):
        m.step([(a, list(range(9)))])
    with pytest.raises(ModelError, match="out of range"):
        m.step([(a, m.n_vocab)])
    with pytest.raises(ModelError, match="context full"):
        a.prefill([1] * 65)
    assert a.n_past == 0
    c = m.sequence()  # b's slot is free again
    assert c.id == 1


def test_the_c_step_checks_everything_first(tiny_llama):
    m = compiler.load(tiny_llama, ctx=64, n_seq=2, page_size=16, prefill_chunk=8)
    a = m.sequence()
    lib, ffi = m.instance.lib, m.instance.ffi
    logits = ffi.new("float[]", 8 * m.n_vocab)

    def step(tokens, seqs):
        b = ffi.new("kiln_batch *", {"n": len(tokens), "token": ffi.new("int32_t[]", tokens),
                                     "seq": ffi.new("int32_t[]", seqs)})
        return lib.kiln_step(m.instance.handle, b, logits)

    assert step([1, 2], [a.id, 1]) == lib.KILN_E_SEQ  # sequence 1 is not open
    assert step([1, 2], [a.id, 99]) == lib.KILN_E_SEQ
    assert step([1, -1], [a.id, a.id]) == lib.KILN_E_TOKEN
    assert step([1] * 9, [a.id] * 9) == lib.KILN_E_BATCH
    assert a.n_past == 0 and m.kv_stats()["pages_used"] == 0
    assert step([1, 2], [a.id, a.id]) == lib.KILN_OK and a.n_past == 2
    assert lib.kiln_seq_close(m.instance.handle, 5) == lib.KILN_E_SEQ and lib.kiln_seq_rollback(m.instance.handle, a.id, 3) == lib.KILN_E_ROLLBACK


def test_generate_batch_equals_one_at_a_time(smollm2):
    m = compiler.load(smollm2, ctx=256, n_seq=3, prefill_chunk=64)
    prompts = ["The capital of France is", "def add(a, b):", "Once upon a time", "1, 2, 3, 4,"]
    batch = m.generate_batch(prompts, max_tokens=12, temperature=0)  # 4 prompts on 3 slots: two waves
    alone = []
    for p in prompts:
        with m.sequence() as s:
            alone.append(s.generate(p, max_tokens=12, temperature=0))
    assert batch == alone and all(batch)
    assert m.kv_stats()["pages_used"] == 0


def test_threads_may_share_a_model(tiny_llama):
    m = compiler.load(tiny_llama, ctx=128, n_seq=4, prefill_chunk=16)
    prompts = [_ids(20, m.n_vocab, 10 + i) for i in range(4)]
    want = []
    for p in prompts:
        with m.sequence() as s:
            want.append(s.generate(p, max_tokens=16, temperature=0))
    got = [None] * 4

    def run(i):
        with m.sequence() as s:
            got[i] = s.generate(prompts[i], max_tokens=16, temperature=0)

    workers = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert got == want



ADVISED_HUGE = """
import os, sys, compiler
def advised():  # bytes of this process's mappings advised into huge pages (VmFlags hg, MADV_HUGEPAGE)
    total = size = 0
    for line in open("/proc/self/smaps"):
        if line.startswith("Size:"):
            size = int(line.split()[1]) * 1024
        elif line.startswith("VmFlags:") and " hg" in " " + line.split(":", 1)[1]:
            total += size
    return total
before = advised()
m = compiler.load(sys.argv[1], ctx=512, n_seq=64, kv_dtype="f32")
packed = m.compiled.packed_path
packed = os.path.getsize(packed) - compiler.core.cconst.PACKED_HEADER_BYTES if packed else 0
print(sum(g["pages_total"] * g["page_bytes"] for g in m.kv_stats()["groups"]), packed, advised() - before)
"""


@pytest.mark.skipif(not os.path.isdir("/sys/kernel/mm/transparent_hugepage"), reason="no transparent huge pages")
def test_the_kv_pool_and_the_packed_weights_are_advised_into_huge_pages(tiny):
    """The paged pool and the packed weights ask for 2 MB pages (huge_pages.h): decode attention
    reads a span of each layer's page, far apart, and decode streams every packed weight once a
    step, and each 4 KB page had cost a page walk. The advice is a mapping's flag whatever pages
    the kernel then finds, so this holds on any machine with THP; a fresh process, so that no
    earlier pool is freed or merged while it counts."""
    path = tiny("llama", n_layer=2, n_embd=256, n_head=4, n_head_kv=2, n_ff=512, wtype=Q.Q4_0)
    r = subprocess.run([sys.executable, "-c", ADVISED_HUGE, str(path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    pool, packed, advised = map(int, r.stdout.split()[-3:])
    assert pool == 64 * 512 * 2 * 2 * 2 * 64 * 4  # sequences x positions x layers x (K, V) x heads x head_dim x f32
    assert packed >= 2 * (2 * 256 + 2 * 128 + 3 * 512) * 256 * 18 // 32  # both layers' q, o; k, v; gate, up, down
    assert advised >= pool + packed, f"{advised} bytes advised into huge pages, fewer than the pool's {pool} and " \
                                     f"the packed weights' {packed}"
