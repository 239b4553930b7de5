"""A draft model for speculative decoding: a second compiled kiln model whose token list is the
target's, run k tokens ahead of each target sequence on a sequence of its own and rolled back
with it (speculation.py verifies what it proposes).

The draft sequence follows the target's: before each draft it rolls back to the longest prefix
it shares with what the target holds plus its current token, and prefills the rest (usually one
or two tokens: the correction or bonus token of the last verification). Sequences that draft
together share each draft step, as the target's verification steps do.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..core.errors import OptionError
from .sampling import Sampler, SamplingParams
from .speculation import draft_room
from .status import ModelError

_SEED_OFFSET = 0x9E3779B97F4A7C15  # the draft's own random stream, derived from the request's seed
_CATCH_UP_IN_STEP = 8  # a longer catch-up (a prompt) is prefilled on its own first


class DraftSequence:
    """One target sequence's drafter on the draft model."""

    def __init__(self, draft, params: SamplingParams):
        self.model = draft
        seed = params.seed if params.seed in (None, -1) else (params.seed + _SEED_OFFSET) % 2**64
        self.sampler = Sampler(replace(params, seed=seed))
        self.sampled = params.temperature > 0  # its drafts carry their distribution q
        try:
            self.seq = draft.sequence()
        except ModelError as e:
            raise OptionError(f"draft_model: {e} (load the draft with n_seq at least the number of sequences "
                              "that decode together)") from None

    def close(self) -> None:
        self.seq.close()

    def room(self, context_len: int) -> int:
        """Drafts the draft model can make after `context_len` tokens (its own context and windows)."""
        return 0 if context_len > self.model.n_ctx else draft_room(self.model, context_len - 1) + 1


def draft_together(jobs: list[tuple[DraftSequence, list[int], list[int], int]]
                   ) -> list[tuple[list[int], list[np.ndarray] | None]]:
    """Drafts for several sequences at once. Each job is (drafter, context: the tokens the target
    holds plus its current one, history: the target's prompt and output for the penalties, k).
    Returns per job its drafts and, for a sampled draft, the distribution each was drawn from."""
    out: list[tuple[list[int], list[np.ndarray] | None]] = [([], [] if d.sampled else None) for d, _, _, _ in jobs]
    live, feed = [], []
    for j, (d, context, _, k) in enumerate(jobs):
        k = min(k, d.room(len(context)))
        if k <= 0:
            continue
        rest = d.seq.reuse_prefix(context)
        if len(rest) > _CATCH_UP_IN_STEP:
            d.seq.prefill(rest[:-1])
            rest = rest[-1:]
        live.append((j, k))
        feed.append(rest)
    while live:
        logits = _step(jobs[0][0].model, [(jobs[j][0].seq, toks) for (j, _), toks in zip(live, feed)])
        still, feed = [], []
        for (j, k), row in zip(live, logits):
            d, _, history, _ = jobs[j]
            drafts, probs = out[j]
            tok = _draw(d, row, history + drafts, probs)
            drafts.append(tok)
            if len(drafts) < k:
                still.append((j, k))
                feed.append([tok])
        live = still
    return out


def _draw(d: DraftSequence, row: np.ndarray, history: list[int], probs: list[np.ndarray] | None) -> int:
    if probs is None:
        return d.sampler(row, history)
    q = d.sampler.distribution(row, history)
    probs.append(q)
    return int(d.sampler.rng.choice(len(q), p=q))


def _step(model, items: list) -> np.ndarray:
    """model.step over items, in as many steps as its batch_tokens needs."""
    budget, out, start = model.options.batch_tokens, [], 0
    while start < len(items):
        rows, end = 0, start
        while end < len(items) and rows + len(items[end][1]) <= budget:
            rows += len(items[end][1])
            end += 1
        end = max(end, start + 1)
        out.append(model.step(items[start:end]))
        start = end
    return np.concatenate(out)
