"""Speculative decoding: drafts, how many to try, and their verification.

A sequence's next tokens are guessed cheaply (a draft), then checked in one step of k+1 rows:
its current token and the k drafted ones, beside other sequences' rows. Row i's logits are
bit for bit those plain decoding would compute after the same tokens (kiln's batch
invariance), so every emitted token is sampled from exactly the logits plain decoding would
sample it from; the draft only decides how many of them one step yields.

Two drafters:
- PromptLookup (n-gram, llama.cpp's `lookup`, vLLM's `ngram`; prompt_lookup.py): a cursor into
  the history (prompt and output) at the place the output is copying from, found by the longest
  recent n-gram that occurred before and moved on with each token it guessed. An index per
  sequence, updated per token, answers without a rescan.
- a draft model (draft_model.py): a smaller kiln model with the same token list.

Acceptance (`verify`): with a deterministic draft (n-gram, or any greedy draft), the target
samples each row as plain decoding would, and a draft token is accepted while it equals the
sampled one. For a deterministic draft (q a point mass) this is the speculative-sampling rule
itself: the draft d is accepted with probability p(d), and on rejection the token is drawn
from p without d, renormalized; the random stream is even consumed exactly as plain decoding
consumes it, so a seeded run gives the same tokens with or without speculation. With a
sampled draft (a draft model at temperature > 0) the standard rule applies: accept d with
probability min(1, p(d)/q(d)), else draw from norm(max(0, p - q)); a full acceptance adds a
token drawn from the last row. Either way the output follows the target's distribution.

DraftLength (draft_length.py) picks k per sequence and per step from the sequence's recent
acceptance rates, by how long an agreement backs the guess, and from what a step of so many rows
costs (StepCost, timed on the model), down to zero when drafts keep failing; an n-gram drafter
keeps scoring the guesses it did not send, so it starts again once they would pay.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..core.errors import OptionError
from .draft_length import DraftLength, StepCost  # noqa: F401  the drafters' parts, from where they were
from .generation import Decoding, Sampled
from .prompt_lookup import LookupDrafts, PromptLookup  # noqa: F401

METHODS = ("ngram", "draft")
MAX_DRAFT_LIMIT = 64  # drafts one step may verify for one sequence (and never more than batch_tokens - 1)
DEFAULT_MAX_DRAFT = 16


@dataclass(frozen=True)
class Speculation:
    """What generate(..., speculative=, draft_model=, max_draft=) asked for, checked."""
    method: str
    max_draft: int = DEFAULT_MAX_DRAFT
    draft_model: object | None = None  # a runtime Model with the target's token list (method "draft")

    @classmethod
    def of(cls, target, speculative: str | None, draft_model=None,
           max_draft: int | None = None) -> "Speculation | None":
        """None when speculation is off; OptionError naming the option for a bad one. A draft_model
        alone means speculative="draft"."""
        if speculative is None and draft_model is not None:
            speculative = "draft"
        if speculative is None:
            if max_draft is not None:
                raise OptionError("max_draft is given but speculative is not: pass speculative='ngram' or 'draft'")
            return None
        if speculative not in METHODS:
            raise OptionError(f"speculative must be 'ngram' or 'draft' (or None for off), got {speculative!r}")
        rows = target.options.batch_tokens
        if rows < 2:
            raise OptionError("speculative decoding verifies drafts in steps of several rows; this model's steps "
                              "take 1 (batch_tokens, --batch-tokens)")
        max_draft = min(DEFAULT_MAX_DRAFT, rows - 1) if max_draft is None else max_draft
        if isinstance(max_draft, bool) or not isinstance(max_draft, (int, np.integer)) \
                or not 1 <= max_draft <= MAX_DRAFT_LIMIT:
            raise OptionError(f"max_draft must be an integer between 1 and {MAX_DRAFT_LIMIT}, got {max_draft!r}")
        if max_draft + 1 > rows:
            raise OptionError(f"max_draft={max_draft} needs steps of {max_draft + 1} rows; this model's steps take "
                              f"{rows} (batch_tokens, --batch-tokens): lower max_draft or compile with more")
        if speculative == "ngram":
            if draft_model is not None:
                raise OptionError("draft_model is used only with speculative='draft', not 'ngram'")
            return cls("ngram", int(max_draft))
        if draft_model is None:
            raise OptionError("speculative='draft' needs draft_model: a model loaded with compiler.load that "
                              "shares the target's token list")
        check_draft_model(target, draft_model)
        return cls("draft", int(max_draft), draft_model)


def check_draft_model(target, draft) -> None:
    """OptionError unless `draft` is a loaded model (the target's kind) with exactly its token list."""
    if not isinstance(draft, type(target)):
        raise OptionError(f"draft_model must be a model loaded with compiler.load, got {type(draft).__name__}")
    if draft is target:
        raise OptionError("draft_model is the target model itself; pass a smaller model with the same vocabulary "
                          "(or speculative='ngram')")
    mine, theirs = target.spec.tokenizer.tokens, draft.spec.tokenizer.tokens
    if draft.n_vocab != target.n_vocab or mine != theirs:
        if len(mine) != len(theirs) or draft.n_vocab != target.n_vocab:
            why = f"{len(theirs)} tokens (n_vocab {draft.n_vocab}) against the target's {len(mine)} ({target.n_vocab})"
        else:
            i = next(i for i, (a, b) in enumerate(zip(mine, theirs)) if a != b)
            why = f"token {i} is {theirs[i]!r} in the draft, {mine[i]!r} in the target"
        raise OptionError(f"draft_model {draft.path.name} does not share the token list of {target.path.name}: "
                          f"{why}; a draft model must use the target's tokenizer")


@dataclass
class SpecStats:
    """What speculation did: verification steps, tokens drafted, of them accepted, tokens emitted."""
    steps: int = 0
    drafted: int = 0
    accepted: int = 0
    emitted: int = 0

    @property
    def acceptance(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_step(self) -> float:
        return self.emitted / self.steps if self.steps else 0.0

    def add(self, drafted: int, accepted: int, emitted: int) -> None:
        self.steps, self.drafted = self.steps + 1, self.drafted + drafted
        self.accepted, self.emitted = self.accepted + accepted, self.emitted + emitted

    def __str__(self) -> str:
        return (f"{self.steps} steps, {self.drafted} drafted, {self.accepted} accepted "
                f"({100 * self.acceptance:.0f}%), {self.tokens_per_step:.2f} tokens/step")


# -- verification -----------------------------------------------------------------------------------
# Called as observer(run, drafts, rows, n_before) at each verification, before any row is sampled:
# the claim that rows[i] are plain decoding's logits is checked bit for bit by reading them here
# (tests/test_speculative_rows.py), on the very arrays every caller's tokens are drawn from.
VERIFY_OBSERVERS: list = []


def verify(run: Decoding, drafts: list[int], rows: np.ndarray, n_before: int,
           draft_probs: list[np.ndarray] | None = None) -> tuple[list[Sampled], int]:
    """The tokens one verification step yields, and how many drafts were accepted.

    rows[i] are the logits after the sequence's current token (i = 0) and drafts[:i]; the
    sequence held n_before positions before the step. Each yielded token goes through `run`
    (its stop strings, EOG, max_tokens and context), so generation ends where plain decoding
    ends it. draft_probs: the draft's full distribution over the vocabulary for each draft
    token when it was sampled (a draft model at temperature > 0); None for a deterministic draft.
    Under a constraint (run.guide) every draft is checked as a deterministic one: accepting d
    exactly when the target's own draw is d keeps the target's distribution whatever q was
    (only less often than the min(1, p/q) rule would).
    The sequence must afterwards keep n_before + len(result) positions."""
    for observe in VERIFY_OBSERVERS:
        observe(run, drafts, rows, n_before)
    out: list[Sampled] = []
    accepted = 0
    for i, row in enumerate(rows):
        n_past = n_before + i + 1
        if draft_probs is not None and i < len(drafts) and run.left > 0 and run.guide is None:
            got = run.take(_accept_or_resample(run, row, drafts[i], draft_probs[i]), n_past)
        else:
            got = run.next(row, n_past)
        out.append(got)
        if got.finish_reason or i >= len(drafts) or got.token != drafts[i]:
            break
        accepted += 1
    return out, accepted


def _accept_or_resample(run: Decoding, row: np.ndarray, draft: int, q: np.ndarray) -> int:
    """Speculative sampling's rule for one drafted token: keep it with probability
    min(1, p/q), else draw from the normalized positive part of p - q. p is the target's
    sampling distribution (penalties, top-k/p, min-p, temperature: the sampler's own)."""
    p = run.sample.distribution(row, run.history, None, run.bias)
    rng = run.sample.rng
    if rng.random() * q[draft] < p[draft]:
        return draft
    residual = np.maximum(p - q, 0.0)
    total = residual.sum()
    if not total > 0:  # p <= q everywhere only when p == q up to rounding: then p itself
        residual, total = p, p.sum()
    return int(rng.choice(len(residual), p=residual / total))


# -- what a sequence may draft -------------------------------------------------------------------
def draft_room(model, n_past: int, rewinds: bool = False) -> int:
    """How many drafts a step may add after a sequence's current token, so that the step fits
    the context and a rollback to any of its rows is possible: a sliding-window group lets a
    page go once the window has passed it, so the step must not move the window's first page.
    A hybrid's recurrent state cannot be rolled back: it drafts only where the caller rewinds
    (Sequence.mark / back_to: the state saved before the step, the accepted tokens run again)."""
    if model.recurrent and not rewinds:
        return 0
    room = model.n_ctx - n_past - 1
    ps = model.page_size
    for window in model.windows:
        if window and room > 0:
            first_block = max(0, n_past + 1 - window + 1) // ps  # what a query at n_past + 1 reads from
            # the largest k with max(0, n_past + k + 1 - window + 1) // ps == first_block
            room = min(room, (first_block + 1) * ps - 1 + window - 1 - (n_past + 1))
    return max(0, room)
