"""Speculative decoding (runtime/speculation.py, spec_decode.py, draft_model.py): the output is
plain decoding's, bit for bit when greedy (both bundled models, every KV dtype, alone and in a
batch, with stop strings, EOG and max_tokens where plain decoding puts them), and the target's
distribution when sampling (a chi-square test at a fixed significance). That the verification
rows' logits themselves are plain decoding's, bit for bit, is test_speculative_rows.py's; the
drafter's and the draft length's parts are test_speculative_policy.py's.

No smaller real model shares a bundled model's vocabulary, so the draft-model tests pair SmolLM2
(or a tiny synthetic target) with tiny synthetic drafts that carry SmolLM2's tokenizer: they test
the mechanics and the exactness, not the speed-up a real pair would give.
"""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

import compiler
from compiler.cli.main import main
from compiler.core.errors import OptionError
from compiler.runtime.sampling import Sampler, SamplingParams
from compiler.runtime.speculation import DraftLength, draft_room

KV_DTYPES = ["f32", "f16", "q8_0", "q4_0"]
PASSAGE = ("The lighthouse keeper climbed the spiral stairs at dusk, lit the great lamp, and wrote in his log "
           "that the sea was calm, the wind was from the west, and no ships had passed since noon.")
PROMPTS = [f"Copy this sentence exactly.\nSentence: {PASSAGE}\nCopy: {PASSAGE[:40]}",  # input-grounded: drafts hit
           "Once upon a time, in a small village by the sea,",  # free: drafts mostly miss
           "Count: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,"]  # the lookup drafts the old digits: they fail
SIGNIFICANCE = 1e-3  # the sampling tests fail a correct sampler once in a thousand runs
# One thread a model: two meet at a spinning barrier every step, which on a machine busy with other
# work waits whenever either is descheduled (the logits do not depend on the thread count).
THREADS = 1


@pytest.fixture
def eager(monkeypatch):
    """Every step drafts max_draft tokens, whatever the adaptive length would choose: most drafts
    then fail part way, which is what the exactness tests must see."""
    monkeypatch.setattr(DraftLength, "choose", lambda self, *a, **k: self.max_draft)


def _plain_and_spec(m, prompt, n: int, **spec) -> tuple[int, int]:
    """generate with and without speculation: the same text and the same tokens held after.
    (drafted, accepted)"""
    plain = m.generate(prompt, max_tokens=n, temperature=0)
    held = list(m.tokens)
    m.reset()
    fast = m.generate(prompt, max_tokens=n, temperature=0, **spec)
    assert fast == plain
    assert m.tokens == held  # drafts past the end were rolled back: the cache is plain decoding's
    m.reset()
    return m.spec_stats.drafted, m.spec_stats.accepted


def _check_exact(m, n: int = 40, **spec) -> None:
    drafted, accepted = np.sum([_plain_and_spec(m, prompt, n, **spec) for prompt in PROMPTS], axis=0)
    assert drafted > accepted > 0  # some drafts held and some failed
    plain = m.generate_batch(PROMPTS * 2, max_tokens=n, temperature=0)
    assert m.generate_batch(PROMPTS * 2, max_tokens=n, temperature=0, **spec) == plain


@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
def test_smollm2_greedy_ngram_is_plain_greedy(smollm2, kv_dtype, eager):
    m = compiler.load(smollm2, ctx=512, n_seq=4, kv_dtype=kv_dtype, prefill_chunk=64, threads=THREADS)
    _check_exact(m, speculative="ngram", max_draft=6)


@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
def test_gemma3_greedy_ngram_is_plain_greedy(gemma3, kv_dtype, eager):
    m = compiler.load(gemma3, ctx=512, n_seq=4, kv_dtype=kv_dtype, prefill_chunk=64, threads=THREADS)
    _check_exact(m, n=32, speculative="ngram", max_draft=6)


def test_adaptive_length_is_plain_greedy_too(smollm2, monkeypatch):
    m = compiler.load(smollm2, ctx=512, n_seq=4, prefill_chunk=64, threads=THREADS)
    runs, choose = [], DraftLength.choose

    def spy(self, decodes=1, rows=None, run=0):
        runs.append(run)
        return choose(self, decodes, rows, run)

    monkeypatch.setattr(DraftLength, "choose", spy)
    _check_exact(m, n=64, speculative="ngram")
    assert max(runs) >= 16  # on the copy prompt the cursor followed the copy, and k was chosen knowing it


@pytest.fixture(scope="module")
def gemma_tiny(tiny, smollm2):
    """5 sliding layers of window 8 in pages of 8: the window lets a page go every few tokens."""
    return tiny("gemma3", wtype=Q.Q8_0, n_layer=6, n_embd=128, n_head=4, n_head_kv=1, head_dim=64, n_ff=256,
                sliding_window=8, tokenizer_from=smollm2)


def test_sliding_window_drafts_stop_where_a_rollback_could_not_reach(gemma_tiny, eager):
    m = compiler.load(gemma_tiny, ctx=256, n_seq=4, page_size=8, prefill_chunk=16, batch_tokens=24, threads=1)
    rep = [int(t) for t in np.random.default_rng(5).integers(300, 2000, 6)] * 12  # a loop the drafts follow
    _plain_and_spec(m, rep, 120, speculative="ngram", max_draft=12)
    assert m.spec_stats.accepted > 0
    for n_past in range(0, 64):  # no step's window moves past the page a rollback to its first row needs
        k = draft_room(m, n_past)
        first = max(0, n_past + 1 - 8 + 1) // 8
        assert max(0, n_past + k + 1 - 8 + 1) // 8 == first and max(0, n_past + k + 2 - 8 + 1) // 8 > first


def test_stops_eog_and_max_tokens_land_where_plain_decoding_puts_them(smollm2, eager):
    m = compiler.load(smollm2, ctx=512, n_seq=4, prefill_chunk=64, threads=THREADS)
    plain = m.generate(PROMPTS[0], max_tokens=40, temperature=0)
    stop = plain[len(plain) // 2:len(plain) // 2 + 4]  # inside a run of accepted drafts
    for kw in ({"stop": stop}, {"stop": [stop, "zzz"]}, {"max_tokens": 7}, {"max_tokens": 13}):
        kw = {"max_tokens": 40} | kw
        m.reset()
        want, held = m.generate(PROMPTS[0], temperature=0, **kw), list(m.tokens)
        m.reset()
        assert m.generate(PROMPTS[0], temperature=0, speculative="ngram", max_draft=8, **kw) == want
        assert m.tokens == held
    chat = "<|im_start|>user\nSay yes.<|im_end|>\n<|im_start|>assistant\n"  # an answer that ends on EOG
    m.reset()
    want, held = m.generate(chat, max_tokens=64, temperature=0), list(m.tokens)
    assert len(held) < len(m.tokenize(chat)) + 63  # it ended before max_tokens
    m.reset()
    assert m.generate(chat, max_tokens=64, temperature=0, speculative="ngram") == want and m.tokens == held


def test_a_stream_closed_early_leaves_the_cache_of_plain_decoding(smollm2, eager):
    m = compiler.load(smollm2, ctx=512, prefill_chunk=64, threads=THREADS)
    pieces = m.generate(PROMPTS[0], max_tokens=40, temperature=0, speculative="ngram", stream=True)
    got = [next(pieces) for _ in range(5)]
    pieces.close()
    spec_tokens = list(m.tokens)
    m.reset()
    plain = m.generate(PROMPTS[0], max_tokens=40, temperature=0, stream=True)
    assert [next(plain) for _ in range(5)] == got
    plain.close()
    assert m.tokens == spec_tokens


# -- draft models ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_pair(tiny, smollm2):
    """A tiny target and its draft, both with SmolLM2's token list: the same random weights in Q8_0
    and in Q4_0, so that the draft's distribution is near the target's without being it."""
    shape = {"n_layer": 2, "n_embd": 128, "n_head": 4, "n_head_kv": 2, "n_ff": 256, "tokenizer_from": smollm2}
    return tiny("llama", wtype=Q.Q8_0, **shape), tiny("llama", wtype=Q.Q4_0, **shape)  # q near p, not equal


def test_draft_model_greedy_is_plain_greedy(smollm2, tiny_pair, eager):
    m = compiler.load(smollm2, ctx=512, n_seq=4, prefill_chunk=64, threads=THREADS)
    draft = compiler.load(tiny_pair[1], ctx=512, n_seq=4, threads=THREADS)
    for prompt in PROMPTS:
        _plain_and_spec(m, prompt, 24, speculative="draft", draft_model=draft, max_draft=3)
    plain = m.generate_batch(PROMPTS * 2, max_tokens=24, temperature=0)
    assert m.generate_batch(PROMPTS * 2, max_tokens=24, temperature=0, draft_model=draft, max_draft=3) == plain
    assert m.spec_stats.drafted > 0 and draft.kv_stats()["sequences"] == 0  # the draft's sequences were closed
    # the same weights: every draft holds
    self_draft = compiler.load(smollm2, ctx=512, n_seq=4, prefill_chunk=64, threads=THREADS)
    drafted, accepted = _plain_and_spec(m, PROMPTS[1], 24, draft_model=self_draft, max_draft=4)
    assert drafted - 4 <= accepted > 0  # all but those past the last token


def test_bad_options_are_refused_by_name(smollm2, tiny, tiny_pair):
    m = compiler.load(tiny_pair[0], ctx=256, prefill_chunk=16, threads=1)
    foreign = compiler.load(tiny("llama", wtype=Q.Q8_0), ctx=256, threads=1)  # the synthetic byte vocabulary
    cases = [({"speculative": "medusa"}, "speculative must be 'ngram' or 'draft'"),
             ({"speculative": "ngram", "max_draft": 0}, "max_draft must be an integer between 1 and 64"),
             ({"speculative": "ngram", "max_draft": 2.5}, "max_draft must be an integer"),
             ({"speculative": "ngram", "max_draft": 16}, "max_draft=16 needs steps of 17 rows"),
             ({"max_draft": 4}, "max_draft is given but speculative is not"),
             ({"speculative": "draft"}, "speculative='draft' needs draft_model"),
             ({"speculative": "ngram", "draft_model": m}, "draft_model is used only with speculative='draft'"),
             ({"draft_model": m}, "draft_model is the target model itself"),
             ({"draft_model": "small.gguf"}, "draft_model must be a model loaded with compiler.load"),
             ({"draft_model": foreign}, "does not share the token list")]
    for kw, message in cases:
        with pytest.raises(OptionError, match=message.replace("(", r"\(").replace(")", r"\)")):
            m.generate("hello", max_tokens=2, **kw)
        with pytest.raises(OptionError):
            m.generate_batch(["hello"], max_tokens=2, **kw)


def test_the_command_line_speculates_with_the_same_output(capsys, smollm2, tiny):
    def run(*argv):
        code = main(["run", str(smollm2), "--ctx", "512", "-p", PROMPTS[0], "-n", "24", "--temp", "0", *argv])
        out, err = capsys.readouterr()
        return code, out, err

    code, plain, _ = run()
    code_spec, spec, err = run("--spec", "ngram", "--spec-max-draft", "6")
    assert code == code_spec == 0 and spec == plain and "speculative decoding (ngram):" in err
    foreign = tiny("llama", wtype=Q.Q8_0)
    for argv, message in ((("--spec", "draft"), "--spec draft needs --draft MODEL"),
                          (("--draft", str(foreign)), "--draft and --spec-max-draft need --spec"),
                          (("--spec", "ngram", "--draft", str(foreign)), "--draft is used only with --spec draft"),
                          (("--spec", "ngram", "--spec-max-draft", "0"), "--spec-max-draft must be between 1 and"),
                          (("--spec", "draft", "--draft", str(foreign)), "does not share the token list")):
        code, out, err = run(*argv)
        assert code == 1 and message in err and "Traceback" not in err, err


def test_bench_spec_smoke(tiny_pair, tmp_path, capsys):
    out = tmp_path / "spec.json"
    assert main(["bench", str(tiny_pair[0]), "--spec", "--threads", "1", "--reps", "1", "--tg", "8",
                 "--json", str(out)]) == 0
    text = capsys.readouterr().out
    rows = json.loads(out.read_text())["results"]
    assert [r["workload"] for r in rows] == ["grounded", "code", "story", "story T=0.8"]
    for r in rows:
        assert r["workload"] in text and r["same_output"]
        assert r["kiln_spec_tok_s"] == max(r["runs"]["kiln spec"]) and len(r["runs"]["kiln"]) == 1
        assert r["llamacpp_tok_s"] > 0 and r["llamacpp_spec_tok_s"] > 0


# -- sampling: the target's distribution ------------------------------------------------------------
def _chi2_sf(stat: float, df: int) -> float:
    """P(X > stat) for X ~ chi-square(df): the regularized upper incomplete gamma Q(df/2, stat/2),
    by its series below a + 1 and its continued fraction above (Numerical Recipes' gammq)."""
    a, x = df / 2, stat / 2
    if x <= 0:
        return 1.0
    log_front = -x + a * math.log(x) - math.lgamma(a)
    if x < a + 1:
        term = total = 1 / a
        for n in range(1, 1000):
            term *= x / (a + n)
            total += term
            if term < total * 1e-15:
                break
        return 1 - total * math.exp(log_front)
    b, c, d = x + 1 - a, 1e300, 1 / (x + 1 - a)
    h = d
    for i in range(1, 1000):
        an = -i * (i - a)
        b += 2
        d, c = 1 / (an * d + b), b + an / c
        h *= d * c
        if abs(d * c - 1) < 1e-15:
            break
    return math.exp(log_front) * h


def test_chi2_tail_matches_known_quantiles():
    assert _chi2_sf(29.588, 10) == pytest.approx(0.001, rel=1e-3)  # tables: chi2.ppf(0.999, 10)
    assert _chi2_sf(3.841, 1) == pytest.approx(0.05, rel=1e-3)
    assert _chi2_sf(124.342, 100) == pytest.approx(0.05, rel=1e-3)


SAMPLING = {"temperature": 1.0, "top_k": 3, "top_p": 1.0, "min_p": 0.0}


def _exact_joint(m, prompt: list[int], depth: int) -> dict[tuple[int, ...], float]:
    """The target's own probability of each sequence of `depth` sampled tokens after prompt."""
    sampler = Sampler(SamplingParams(**SAMPLING))
    joint = {(): 1.0}
    with m.sequence() as s:
        for _ in range(depth):
            nxt = {}
            for path, pr in joint.items():
                s.reset()
                p = sampler.distribution(s.prefill(prompt + list(path)), prompt + list(path))
                for t in np.flatnonzero(p):
                    nxt[path + (int(t),)] = pr * p[t]
            joint = nxt
    return joint


@pytest.mark.parametrize("method", ["draft", "ngram"])
def test_sampled_output_follows_the_targets_distribution(tiny_pair, method, eager):
    target = compiler.load(tiny_pair[0], ctx=128, n_seq=2, prefill_chunk=16, threads=1)
    draft = compiler.load(tiny_pair[1], ctx=128, threads=1) if method == "draft" else None
    base = [int(t) for t in np.random.default_rng(3).integers(300, 2000, 5)]
    target.generate(base, max_tokens=6, temperature=0)
    prompt = list(target.tokens) + base  # base, the target's likeliest continuation, base again: the
    target.reset()                       # n-gram drafter proposes that continuation
    joint = _exact_joint(target, prompt, 3)
    assert not set().union(*joint) & target.spec.tokenizer.eog_ids  # no path ends early
    n, counts, drafted, accepted = 2000, {}, 0, 0
    spec = {"speculative": method, "max_draft": 2, "draft_model": draft}
    for seed in range(n):
        target.generate(prompt, max_tokens=4, seed=seed, **SAMPLING, **spec)  # t1..t3 are fed, t4 is not
        path = tuple(target.tokens[len(prompt):])
        counts[path] = counts.get(path, 0) + 1
        drafted, accepted = drafted + target.spec_stats.drafted, accepted + target.spec_stats.accepted
    assert set(counts) <= set(joint)
    assert drafted > accepted > 0  # the rule both kept and replaced drafts
    cells = sorted(joint, key=joint.get, reverse=True)
    big = [c for c in cells if joint[c] * n >= 5]  # the rest pooled into one cell
    observed = [counts.get(c, 0) for c in big] + [n - sum(counts.get(c, 0) for c in big)]
    expected = [joint[c] * n for c in big] + [n * (1 - sum(joint[c] for c in big))]
    if expected[-1] < 5:
        observed[-2:], expected[-2:] = [observed[-2] + observed[-1]], [expected[-2] + expected[-1]]
    stat = sum((o - e) ** 2 / e for o, e in zip(observed, expected))
    assert _chi2_sf(stat, len(observed) - 1) > SIGNIFICANCE, (stat, len(observed))


def test_seeded_ngram_sampling_gives_plain_decodings_tokens(tiny_pair, eager):
    m = compiler.load(tiny_pair[0], ctx=128, prefill_chunk=16, threads=1)
    prompt = [int(t) for t in np.random.default_rng(4).integers(300, 2000, 6)] * 3
    for seed in range(20):
        plain = m.generate(prompt, max_tokens=24, seed=seed, **SAMPLING)
        m.reset()
        assert m.generate(prompt, max_tokens=24, seed=seed, speculative="ngram", max_draft=4, **SAMPLING) == plain
        m.reset()
    assert m.spec_stats.drafted > 0
