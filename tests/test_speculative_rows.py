"""Speculative decoding's verification rows (runtime/speculation.py): every row of every
verification step holds, bit for bit, the logits plain decoding computes after the same tokens,
one token a step. Not only the tokens they give: a verification that rounded its logits, or ran
on a stale cache, could still pick the same argmax most of the time.

The rows are read where verify() reads them (speculation.VERIFY_OBSERVERS), while two prompts
decode together (generate_batch: each verification beside the other sequence's rows). Rows up to
the first rejected draft are compared with plain greedy decoding's logits at that position; the
rows after it, which the verification computes and discards, with one decode of the drafted token
after the same context. Both bundled models, f32 and f16 caches, n-gram and draft-model drafting.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

import compiler
from compiler.core.sequences import common_prefix
from compiler.runtime import speculation
from compiler.runtime.speculation import DraftLength

PASSAGE = ("The lighthouse keeper climbed the spiral stairs at dusk, lit the great lamp, and wrote in his log "
           "that the sea was calm, the wind was from the west, and no ships had passed since noon.")
PROMPTS = [f"Copy this sentence exactly.\nSentence: {PASSAGE}\nCopy: {PASSAGE[:40]}",  # drafts hold
           "Once upon a time, in a small village by the sea,"]  # drafts mostly fail
MAX_TOKENS, MAX_DRAFT = 24, 4


@dataclass
class Verification:
    run: object  # the lane's Decoding: its history, once generation ends, is prompt and whole output
    context: list[int]  # the tokens the sequence held before the step, then its current token
    drafts: list[int]
    rows: np.ndarray  # [1 + len(drafts), vocab]: row i follows context + drafts[:i]
    n_before: int  # the positions the sequence held before the step: len(context) - 1 if it holds them


@pytest.fixture
def verifications(monkeypatch) -> list[Verification]:
    """Every verification of the test, its rows copied as verify() received them. Every step
    drafts MAX_DRAFT tokens (the adaptive length would stop drafting where drafts fail)."""
    seen: list[Verification] = []

    def observe(run, drafts, rows, n_before):
        seen.append(Verification(run, list(run.history), list(drafts), np.array(rows, copy=True), n_before))

    monkeypatch.setattr(speculation, "VERIFY_OBSERVERS", [observe])
    monkeypatch.setattr(DraftLength, "choose", lambda self, *a, **k: self.max_draft)
    return seen


def _plain_logits(m, tokens: list[int], n_prompt: int) -> dict[int, np.ndarray]:
    """Plain greedy decoding over `tokens` (prompt, then output): the logits by the positions held
    when each row was computed, the prompt prefilled and then one token a step; each output token
    is checked to be the greedy pick of the row before it."""
    with m.sequence() as s:
        out = {n_prompt: s.prefill(tokens[:n_prompt])}
        for n in range(n_prompt, len(tokens)):
            assert int(np.argmax(out[n])) == tokens[n], f"token {n} is not plain greedy decoding's"
            out[n + 1] = s.decode(tokens[n])
    return out


def _check_rows(m, ids: list[int], seen: list[Verification], plain: dict, label: str) -> tuple[int, int, int]:
    """One prompt's verifications against plain decoding (`plain`: its logits by position, and the
    whole output it gives). (Rows compared with plain decoding's own, those of them after accepted
    drafts, rows after a rejected draft.)"""
    mine = [v for v in seen if v.context[:len(ids)] == ids]
    assert mine, f"{label}: no verification for the prompt of {len(ids)} tokens"
    whole = mine[0].run.history  # the same Decoding throughout: prompt and the whole output
    assert all(v.run is mine[0].run for v in mine)
    if "whole" not in plain:
        plain["whole"], plain["logits"] = list(whole), _plain_logits(m, whole, len(ids))
    assert whole == plain["whole"], f"{label}: the output is not plain greedy decoding's"
    at_plain, accepted, discarded = 0, 0, 0
    with m.sequence() as s:
        s.prefill(whole)
        # latest first: each rollback goes back from where the one before it left the sequence
        for v in sorted(mine, key=lambda v: len(v.context), reverse=True):
            assert len(v.rows) == 1 + len(v.drafts)
            held = common_prefix(v.context + v.drafts, whole)
            assert held >= len(v.context), f"{label}: a verification after tokens plain decoding did not give"
            for i, row in enumerate(v.rows):
                at = len(v.context) + i  # positions held when row i is computed
                where = f"{label}: the verification at position {len(v.context) - 1}, row {i} of {len(v.rows)}"
                if at <= held:
                    np.testing.assert_array_equal(row, plain["logits"][at],
                                                  err_msg=f"{where}: not plain decoding's logits")
                    at_plain, accepted = at_plain + 1, accepted + (i > 0)
                    continue
                if at == held + 1:
                    s.rollback(held)
                expected = s.decode(v.drafts[i - 1])
                np.testing.assert_array_equal(row, expected, err_msg=f"{where}, after a rejected draft: not the "
                                                                      "logits of decoding the drafted token")
                discarded += 1
            assert v.n_before == len(v.context) - 1, \
                f"{label}: the verification at position {len(v.context) - 1} ran on {v.n_before} positions held"
    return at_plain, accepted, discarded


@pytest.mark.parametrize("kv_dtype", ["f32", "f16"])
@pytest.mark.parametrize("model", ["smollm2", "gemma3"])
def test_verification_rows_are_plain_decodings_logits(request, model, kv_dtype, verifications):
    path = request.getfixturevalue(model)
    # one thread each: two would meet at a spinning barrier every step, which on a busy machine
    # waits whenever either is descheduled (logits do not depend on the thread count)
    m = compiler.load(path, ctx=512, n_seq=4, kv_dtype=kv_dtype, prefill_chunk=64, threads=1)
    # the draft: the same weights over a q4_0 cache, a model apart that mostly agrees with the target
    draft = compiler.load(path, ctx=512, n_seq=4, kv_dtype="q4_0", prefill_chunk=64, threads=1)
    ids = [m.prompt_ids(p) for p in PROMPTS]
    plain: list[dict] = [{} for _ in PROMPTS]  # plain decoding's, computed once for both drafters
    discarded = 0
    for method in ("ngram", "draft"):
        verifications.clear()
        m.generate_batch(PROMPTS, max_tokens=MAX_TOKENS, temperature=0, speculative=method,
                         draft_model=draft if method == "draft" else None, max_draft=MAX_DRAFT)
        label = f"{model}, {kv_dtype} cache, {method} drafts"
        counts = np.sum([_check_rows(m, i, verifications, p, label) for i, p in zip(ids, plain)], axis=0)
        assert counts[1] > 0, f"{label}: no draft held, so no row past the first was compared with plain decoding"
        discarded += counts[2]
        print(f"\n{label}: {len(verifications)} verifications, {counts[0]} rows at plain decoding's positions "
              f"({counts[1]} after accepted drafts), {counts[2]} after a rejected draft")
    assert discarded > 0, f"{model}, {kv_dtype} cache: no draft failed, so no row after a rejected one was checked"
