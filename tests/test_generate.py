"""Sampling, generation, chat templates and `kiln run` on the real default model."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import compiler
from compiler.text.chat import render_chat
from compiler.core.errors import OptionError
from compiler.runtime.sampling import Sampler, SamplingParams


@pytest.fixture(scope="module")
def smol(smollm2):
    return compiler.load(smollm2, ctx=256)


def test_greedy_and_top_k_1_pick_the_argmax():
    logits = np.random.default_rng(0).standard_normal(1000).astype(np.float32)
    assert Sampler(SamplingParams(temperature=0))(logits, []) == int(logits.argmax())
    assert Sampler(SamplingParams(temperature=1.5, top_k=1, seed=3))(logits, []) == int(logits.argmax())


def test_seeded_sampling_is_reproducible_and_filters_apply():
    logits = np.random.default_rng(1).standard_normal(500).astype(np.float32) * 3
    def draws(seed: int) -> list[int]:
        sampler = Sampler(SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=seed))
        return [sampler(logits, []) for _ in range(20)]

    assert draws(7) == draws(7) and draws(7) != draws(8)  # the seed decides, and it is not ignored
    top5 = set(np.argsort(-logits)[:5].tolist())
    s = Sampler(SamplingParams(temperature=2.0, top_k=5, top_p=1.0, min_p=0.0, seed=1))
    assert {s(logits, []) for _ in range(200)} <= top5
    s = Sampler(SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.5, seed=1))
    p = np.exp(logits - logits.max())
    assert all(p[s(logits, [])] >= 0.5 for _ in range(100))


def test_repeat_penalty_discourages_history():
    logits = np.array([2.0, 1.9, -1.0], np.float32)
    assert Sampler(SamplingParams(temperature=0, repeat_penalty=1.5))(logits, [0]) == 1


@pytest.mark.parametrize("kw", [{"temperature": -1}, {"top_p": 0}, {"min_p": 2}, {"top_k": -1}])
def test_sampling_options_are_checked(kw):
    with pytest.raises(OptionError):
        SamplingParams(**kw)


def test_generate_streams_the_same_text(smol):
    whole = smol.generate("The capital of France is", max_tokens=12, temperature=0)
    pieces = list(smol.generate("The capital of France is", max_tokens=12, temperature=0, stream=True))
    assert "".join(pieces) == whole and len(pieces) > 1
    assert "Paris" in whole


def test_stop_strings_cut_the_output(smol):
    text = smol.generate("Count: 1, 2, 3,", max_tokens=30, temperature=0, stop=[", 7"])
    assert text.endswith("6") and ", 7" not in text


def test_prefix_reuse_keeps_the_shared_prefix(smol):
    smol.reset()
    base = smol.tokenize("The history of the printing press began")
    smol.prefill(base)
    longer = base + smol.tokenize(" in Germany", add_special=False)
    remaining = smol.default_sequence.reuse_prefix(longer)
    assert smol.n_past == len(base) and remaining == longer[len(base):]
    reused = smol.prefill(remaining)
    fresh = compiler.load(smol.spec.path, ctx=256).prefill(longer)
    np.testing.assert_allclose(reused, fresh, rtol=1e-5, atol=1e-5)


def test_chat_template_renders_smollm2(smol):
    text = render_chat(smol.spec, [{"role": "user", "content": "Hi"}])
    assert text.startswith("<|im_start|>system\n") and text.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    ids = smol.tokenize(text)
    assert ids.count(1) == 3 and ids.count(2) == 2  # <|im_start|>, <|im_end|> parsed as specials


def test_kiln_run_streams_a_continuation(smollm2):
    r = subprocess.run([sys.executable, "-m", "compiler", "run", "-p", "The capital of France is", "-n", "8",
                        "--temp", "0", "--ctx", "256"], capture_output=True, text=True, env=dict(os.environ))
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("The capital of France is") and "Paris" in r.stdout


def test_kiln_run_rejects_bad_sampling_options(smollm2):
    r = subprocess.run([sys.executable, "-m", "compiler", "run", "-p", "x", "--temp", "-1", "--ctx", "256"],
                       capture_output=True, text=True)
    assert r.returncode == 1 and "sampling option temperature is out of range: -1" in r.stderr
    assert "Traceback" not in r.stderr


def test_partial_selection_orders_as_a_full_sort():
    """top-k by argpartition: the same k tokens in the same order as a stable full sort, ties by id."""
    rng = np.random.default_rng(5)
    for x in (rng.standard_normal(5000), np.round(rng.standard_normal(5000) * 2)):  # the second full of ties
        for k in (1, 2, 7, 40, 4999, 5000, 10**9):
            np.testing.assert_array_equal(Sampler._best_first(x, k), np.argsort(-x, kind="stable")[:k])
