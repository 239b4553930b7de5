"""Teacher-forced logits against llama.cpp on the same GGUF: mean KL(llama.cpp || kiln) and top-1.

For scale: llama.cpp against itself with a different batch size gives a mean KL of about 3e-3
and 95-100% top-1 on SmolLM2.
"""
from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

import compiler
from reference import Reference, compare

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


@pytest.fixture(scope="module")
def smollm2_pair(smollm2):
    return Reference(smollm2, n_ctx=512), compiler.load(smollm2, ctx=512)


def test_smollm2_logits_match_llamacpp(smollm2_pair):
    ref, kiln = smollm2_pair
    rows_ref, rows_kiln = [], []
    print(f"\n{'prompt':<44} {'tokens':>6} {'mean KL':>10} {'top-1':>7} {'max|d|':>8}")
    for prompt in PROMPTS:
        ids = ref.tokenize(prompt)
        seq = ids + ref.greedy(ids, CONTINUATION)
        want = ref.logits(seq)
        kiln.reset()
        got = kiln.prefill(seq, logits="all")
        span = slice(len(ids) - 1, len(seq) - 1)  # positions that predict the continuation
        a = compare(want[span], got[span])
        print(f"{prompt[:42]!r:<44} {len(seq):>6} {a.mean_kl:>10.2e} {a.top1:>7.1%} {a.max_abs:>8.3f}")
        rows_ref.append(want[span])
        rows_kiln.append(got[span])
    total = compare(np.concatenate(rows_ref), np.concatenate(rows_kiln))
    print(f"{'all prompts':<44} {total.positions:>6} {total.mean_kl:>10.2e} {total.top1:>7.1%} {total.max_abs:>8.3f}")
    assert total.mean_kl <= 5e-3 and total.top1 >= 0.97


@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.Q4_0, Q.Q4_1], ids=lambda q: q.name)
@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_synthetic_logits_match_llamacpp(tiny, smollm2, arch, qtype):
    path = tiny(arch, wtype=qtype, n_embd=128, n_head=4, n_head_kv=2, n_ff=256, tokenizer_from=smollm2)
    ref = Reference(path, n_ctx=128)
    kiln = compiler.load(path, ctx=128, prefill_chunk=16)
    seq = [int(t) for t in np.random.default_rng(5).integers(0, 49152, 70)]
    a = compare(ref.logits(seq), kiln.prefill(seq, logits="all"))
    print(f"\n{arch} {qtype.name}: mean KL {a.mean_kl:.2e}, top-1 {a.top1:.1%}, max|d| {a.max_abs:.4f}")
    assert a.mean_kl <= 5e-3 and a.top1 >= 0.97
