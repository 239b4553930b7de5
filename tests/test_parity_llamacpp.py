"""Teacher-forced logits against llama.cpp on the same GGUF: mean KL(llama.cpp || kiln) and top-1.

For scale: llama.cpp against itself with a different batch size gives a mean KL of about 3e-3
and 95-100% top-1 on SmolLM2.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

import compiler
from compiler.tools.kv_quality import DEFAULT_TEXT
from reference import Reference, combined, compare

LONG_TEXT = DEFAULT_TEXT.read_text()

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Once upon a time, in a small village at the edge of a forest,",
    "<|im_start|>user\nWhat is the boiling point of water at sea level?<|im_end|>\n<|im_start|>assistant\n",
    "List of prime numbers: 2, 3, 5, 7, 11,",
    "Das Wetter in Berlin ist heute",
    '{"name": "kiln", "language": "Python", "features": [',
    "In 1969, Neil Armstrong became the first person to",
    "Photosynthesis converts light energy into",
]
CONTINUATION = 48


def teacher_forced(ref: Reference, kiln, prompt: str) -> tuple[np.ndarray, np.ndarray, int]:
    """Logits of both engines at every position that predicts llama.cpp's greedy continuation.

    kiln prefills the prompt for its last row only and the continuation with every row, so a
    long prompt does not pay for [prompt, vocab] logits it would throw away."""
    ids = ref.tokenize(prompt)
    cont = ref.greedy(ids, CONTINUATION)
    want = ref.logits(ids + cont, range(len(ids) - 1, len(ids) + len(cont) - 1))
    kiln.reset()
    got = np.vstack([kiln.prefill(ids)[None], kiln.prefill(cont[:-1], logits="all")])
    return want, got, len(ids) + len(cont)


def report(name: str, n: int, a) -> None:
    print(f"{name[:42]!r:<44} {n:>6} {a.mean_kl:>10.2e} {a.top1:>7.1%} {a.max_abs:>8.3f}")


def assert_parity(ref: Reference, kiln, prompts: list[str], min_top1: float = 0.97) -> None:
    print(f"\n{'prompt':<44} {'tokens':>6} {'mean KL':>10} {'top-1':>7} {'max|d|':>8}")
    parts = []
    for prompt in prompts:
        want, got, n = teacher_forced(ref, kiln, prompt)
        parts.append(compare(want, got))
        report(prompt, n, parts[-1])
    total = combined(parts)
    report("all prompts", total.positions, total)
    assert total.mean_kl <= 5e-3 and total.top1 >= min_top1


@pytest.fixture(scope="module")
def smollm2_pair(smollm2):
    return Reference(smollm2, n_ctx=512), compiler.load(smollm2, ctx=512)


def test_smollm2_logits_match_llamacpp(smollm2_pair):
    assert_parity(*smollm2_pair, PROMPTS)


@pytest.mark.parametrize("kv_dtype", ["f16", "q8_0"])
def test_smollm2_quantized_kv_still_matches_llamacpp(smollm2, kv_dtype):
    # llama.cpp holds the same cache type: the comparison measures the engines, not the cache
    assert_parity(Reference(smollm2, n_ctx=512, kv_dtype=kv_dtype), compiler.load(smollm2, ctx=512, kv_dtype=kv_dtype),
                  PROMPTS)


def teacher_forced_batch(ref: Reference, kiln, prompts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """teacher_forced for every prompt at once: kiln prefills each prompt in its own sequence,
    then feeds the continuations one token per sequence per step, all sequences in one step."""
    ids = [ref.tokenize(p) for p in prompts]
    conts = [ref.greedy(i, CONTINUATION) for i in ids]
    want = np.concatenate([ref.logits(i + c, range(len(i) - 1, len(i) + len(c) - 1)) for i, c in zip(ids, conts)])
    seqs = [kiln.sequence() for _ in prompts]
    got = [[s.prefill(i)] for s, i in zip(seqs, ids)]
    for j in range(CONTINUATION - 1):
        for g, row in zip(got, kiln.step([(s, c[j]) for s, c in zip(seqs, conts)])):
            g.append(row)
    for s in seqs:
        s.close()
    return want, np.concatenate([np.vstack(g) for g in got])


@pytest.mark.parametrize("kv_dtype", ["f32"])
def test_smollm2_parity_holds_when_the_sequences_decode_together(smollm2, kv_dtype):
    """Every prompt in its own sequence, all decoding in the same steps: the logits are those of
    one sequence at a time, bit for bit, so parity is exactly the single-sequence figure. (That a
    step's rows are the one-at-a-time bits for every KV dtype is test_batch.py's; each dtype's
    parity, test_smollm2_quantized_kv_still_matches_llamacpp's: f32 here joins the two.)"""
    ref = Reference(smollm2, n_ctx=512, kv_dtype=kv_dtype)
    kiln = compiler.load(smollm2, ctx=512, kv_dtype=kv_dtype, n_seq=len(PROMPTS))
    want, got = teacher_forced_batch(ref, kiln, PROMPTS)
    alone = np.concatenate([teacher_forced(ref, kiln, p)[1] for p in PROMPTS])
    np.testing.assert_array_equal(got, alone)
    a = compare(want, got)
    report(f"{len(PROMPTS)} sequences in one step, {kv_dtype} KV", a.positions, a)
    assert a.mean_kl <= 5e-3 and a.top1 >= 0.97


GEMMA_PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n",
    "Once upon a time, in a small village at the edge of a forest,",
    "<start_of_turn>user\nWhat is the boiling point of water at sea level?<end_of_turn>\n<start_of_turn>model\n",
    "List of prime numbers: 2, 3, 5, 7, 11,",
    "In 1969, Neil Armstrong became the first person to",
    LONG_TEXT,  # ~1500 tokens: every 512-token local ring wraps around several times
]


def test_gemma3_logits_match_llamacpp(gemma3):
    assert_parity(Reference(gemma3, n_ctx=2048), compiler.load(gemma3, ctx=2048), GEMMA_PROMPTS)


@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.Q4_0, Q.Q4_1], ids=lambda q: q.name)
@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "gemma3"])
def test_synthetic_logits_match_llamacpp(tiny, smollm2, arch, qtype):
    # gemma3: 6 layers (one global), MQA, a window of 8, so 70 tokens wrap every local ring many times
    shape = dict(n_embd=128, n_head=4, n_head_kv=2, n_ff=256)
    if arch == "gemma3":
        shape |= dict(n_layer=6, n_head_kv=1, head_dim=64, sliding_window=8)
    path = tiny(arch, wtype=qtype, tokenizer_from=smollm2, **shape)
    ref = Reference(path, n_ctx=128)
    kiln = compiler.load(path, ctx=128, prefill_chunk=16)
    seq = [int(t) for t in np.random.default_rng(5).integers(0, 49152, 70)]
    a = compare(ref.logits(seq), kiln.prefill(seq, logits="all"))
    print(f"\n{arch} {qtype.name}: mean KL {a.mean_kl:.2e}, top-1 {a.top1:.1%}, max|d| {a.max_abs:.4f}")
    # measured 0.9e-6 to 4.5e-6 over these 12 cases: a bound 20x above the largest, far below the
    # 3e-3 of real text, so a kernel or a template that drifts shows here first
    assert a.mean_kl <= 1e-4 and a.top1 >= 0.97
