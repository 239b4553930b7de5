"""The decoding loops of one sequence (Model.generate_on) and, with speculation on, of a wave of
them (Model.generate_batch; batch.py has the plain one).

With speculation, each round drafts for every running sequence (speculation.py: how many, and
what), then runs one step holding each sequence's current token and its drafts, and verifies
them. Plain decoding is the same loop with no drafts, so a round with k = 0 everywhere costs what
a plain step costs. Whatever the drafts, the tokens are those plain decoding gives.

The loops act on sequences (sequence.py) and ask their model (model.py, which imports this
module) for prompts and decoding states through the sequence: nothing here imports either.
"""
from __future__ import annotations

import json
import time
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..core.files import write_atomically
from .draft_length import DraftLength, StepCost
from .draft_model import DraftSequence, draft_together
from .generation import Decoding, Sampled
from .sampling import SamplingParams
from .prompt_lookup import LookupDrafts
from .speculation import Speculation, SpecStats, draft_room, verify
from .status import ModelError, PoolFullError

PROBE_EVERY = 8  # a draft-model sequence that stopped drafting tries one token again after this many steps
# The row counts a model's steps are timed at: every one a step of the default max_draft may take,
# since the curve has steps of its own (StepCost); longer steps cost the mean row past the last.
TIMED_ROWS = tuple(range(1, 18))
# a model's step cost and the most rows it was timed at, timed once per model and process
_COSTS: "weakref.WeakKeyDictionary[object, tuple[int, StepCost]]" = weakref.WeakKeyDictionary()


@dataclass(eq=False)
class Lane:
    """One sequence being decoded with speculation."""
    seq: object  # Sequence
    run: Decoding
    ngram: LookupDrafts | None = None  # prompt lookup, with its draft length
    length: DraftLength | None = None  # a draft model's draft length
    drafter: DraftSequence | None = None
    pending: int | None = None  # the sampled token the next step feeds
    done: bool = False
    idle: int = 0  # steps since a draft-model lane last drafted
    drafts: list[int] = field(default_factory=list)
    probs: list[np.ndarray] | None = None
    index: int = 0  # generate_batch's prompt index
    mark: object = None  # a hybrid's: the sequence before the last step, and the tokens it kept of it
    kept: list[int] = field(default_factory=list)

    def back_to(self, n_past: int) -> None:
        """Hold the first n_past positions (a caller stopped mid-round)."""
        if self.mark is not None:
            self.seq.back_to(self.mark, self.kept[:n_past - self.mark.n_past])
        else:
            self.seq.rollback(n_past)

    def close(self) -> None:
        if self.drafter is not None:
            self.drafter.close()


def lane(spec: Speculation, seq, run: Decoding, params: SamplingParams, cost: StepCost) -> Lane:
    if spec.method == "ngram":
        return Lane(seq, run, ngram=LookupDrafts(run.history, spec.max_draft, cost))
    return Lane(seq, run, length=DraftLength(spec.max_draft, cost), drafter=DraftSequence(spec.draft_model, params))


def step_cost(model, seq, token: int) -> StepCost:
    """The model's step time by rows (StepCost), timed on `seq` (its extra rows rolled back) with
    every row's logits, as a verification has them (each row adds a pass over the output matrix).
    Timed once per model and kept beside its build for the next process at as many threads, which
    times a one-row step to check it and times all again if that differs by a quarter or more.
    Where fewer rows fit than TIMED_ROWS asks, what fits is timed, kept for this process (a later
    call that fits no more rows reuses it) and not written."""
    fits = min(draft_room(model, seq.n_past, rewinds=True) + 1, model.options.batch_tokens)
    counts = [r for r in TIMED_ROWS if r <= fits]
    if len(counts) < 2:
        return StepCost()
    timed_to, cost = _COSTS.get(model, (0, None))
    if cost is not None and timed_to >= counts[-1]:
        return cost
    module = getattr(getattr(model, "compiled", None), "module", None)
    kept = (Path(module.__file__).with_name(f"step_cost.{model.instance.n_threads}threads.json")
            if module is not None and len(counts) == len(TIMED_ROWS) else None)
    if kept is not None and kept.is_file():
        try:
            saved = StepCost({int(r): float(t) for r, t in json.loads(kept.read_text()).items()})
        except (OSError, ValueError, AttributeError):
            saved = None
        one = _timed(model, seq, token, [1], 3)
        if saved is not None and one is not None and abs(one[1] / saved.time(1) - 1) < 0.25:
            _COSTS[model] = (counts[-1], saved)
            return saved
    points = _timed(model, seq, token, counts, 2)
    if points is None:
        return StepCost()
    cost = StepCost(points)
    _COSTS[model] = (counts[-1], cost)
    if kept is not None:
        try:
            write_atomically(kept, json.dumps(points).encode())
        except OSError:  # a cache it cannot write: timed again next time
            pass
    return cost


def _timed(model, seq, token: int, counts: list[int], runs: int) -> dict[int, float] | None:
    """The best of `runs` timings of a step of each row count, the counts interleaved so that a busy
    moment spreads over all of them, and up to four where the two best differ by a tenth (a reading
    is high by noise, never low); None where the pool has no room for the rows."""
    n, mark = seq.n_past, seq.mark()
    times: dict[int, list[float]] = {r: [] for r in counts}
    try:
        for i in range(4):
            for r in [r for r, t in times.items() if i < runs or sorted(t)[1] > 1.1 * min(t)]:
                t0 = time.perf_counter()
                model.step_rows([(seq, [token] * r)], [True])
                times[r].append(time.perf_counter() - t0)
                seq.back_to(mark)
    except ModelError:
        if seq.n_past > n:
            seq.back_to(mark)
        return None
    return {r: min(t) for r, t in times.items()}


def calibrate(model) -> StepCost:
    """step_cost on a sequence of its own (a server times its model once, before serving)."""
    try:
        with model.sequence() as seq:
            seq.prefill([0])
            return step_cost(model, seq, 0)
    except ModelError:  # no free sequence
        return StepCost()


def _plan(model, lanes: list[Lane]) -> None:
    """Each lane's drafts for this round, within the step's rows."""
    base = len(lanes)
    spare = model.options.batch_tokens - base
    jobs = []
    for ln in lanes:
        ln.drafts, ln.probs = [], None
        room = min(draft_room(model, ln.seq.n_past, rewinds=True), spare)
        if ln.ngram is not None:
            ln.drafts = ln.ngram.draft(room, base)
            spare -= len(ln.drafts)
            continue
        k = min(ln.length.choose(base), room)
        if k == 0 and ln.idle >= PROBE_EVERY and room > 0:
            k = 1
        ln.idle = 0 if k else ln.idle + 1
        if k:
            jobs.append((ln, k))
        spare -= k
    if jobs:
        made = draft_together([(ln.drafter, ln.seq.tokens + [ln.pending], ln.run.history, k) for ln, k in jobs])
        for (ln, _), (drafts, probs) in zip(jobs, made):
            ln.drafts, ln.probs = drafts, probs


def rounds(model, lanes: list[Lane], stats: SpecStats, sinks: int | None) -> Iterator[tuple[Lane, Sampled, int]]:
    """Decode the lanes (each with its pending token set) until all are done. Yields each token
    as (lane, what it adds, the positions the sequence would hold at that token had it been
    decoded alone: n_past before feeding it)."""
    while True:
        active = [ln for ln in lanes if not ln.done]
        if not active:
            return
        if sinks is not None:
            for ln in active:
                ln.seq.shift_if_full(sinks)
        _plan(model, active)
        before = [ln.seq.n_past for ln in active]
        # a hybrid's state before a step with drafts, to rewind to where a draft fails
        marks = [ln.seq.mark() if model.recurrent and ln.drafts else None for ln in active]
        try:
            rows = model.step_rows([(ln.seq, [ln.pending] + ln.drafts) for ln in active], [True] * len(active))
        except PoolFullError:  # no pages for the drafts' positions: the step goes on without them
            if not any(ln.drafts for ln in active):
                raise
            for ln in active:
                ln.drafts, ln.probs = [], None
                if ln.ngram is not None:
                    ln.ngram.drop()
            rows = model.step_rows([(ln.seq, [ln.pending]) for ln in active], [True] * len(active))
        for ln, n_before, mark, logits in zip(active, before, marks, rows):
            got, accepted = verify(ln.run, ln.drafts, logits, n_before, ln.probs)
            ln.mark, ln.kept = mark, ([ln.pending] + ln.drafts)[:len(got)]
            if n_before + len(got) < ln.seq.n_past:
                if mark is not None:  # the current token and the accepted drafts run again from the saved state
                    ln.seq.back_to(mark, ln.kept)
                else:
                    ln.seq.rollback(n_before + len(got))
            stats.add(len(ln.drafts), accepted, len(got))
            if ln.ngram is not None:
                ln.ngram.observe(accepted, got[0].token)
            elif ln.drafts:
                ln.length.observe(accepted, len(ln.drafts))
            for i, g in enumerate(got):
                yield ln, g, n_before + i + 1
            if got[-1].finish_reason:
                ln.done = True
            else:
                ln.pending = got[-1].token


def generate_plain(seq, prompt, max_tokens: int, params: SamplingParams, stops: list[str], sinks: int | None,
                   guide=None, bias=None) -> Iterator[str]:
    """Model.generate_on without speculation: the prompt's new part prefilled, then a token a step."""
    m = seq.model
    ids = m.prompt_ids(prompt)
    logits = seq.prefill(seq.reuse_prefix(ids))
    run = m.decoding(ids, params, stops, max_tokens, context_shift=sinks is not None, guide=guide, bias=bias)
    while True:
        out = run.next(logits, seq.n_past)
        if out.text:
            yield out.text
        if out.finish_reason:
            return
        if sinks is not None:
            seq.shift_if_full(sinks)
        logits = seq.decode(out.token)


def generate_one(seq, prompt, max_tokens: int, params: SamplingParams, stops: list[str], sinks: int | None,
                 spec: Speculation, stats: SpecStats, guide=None, bias=None) -> Iterator[str]:
    """Model.generate_on with speculation: its text piece by piece. Stopped early (the caller
    closes the generator), the sequence holds what plain decoding would hold at that token."""
    m = seq.model
    ids = m.prompt_ids(prompt)
    logits = seq.prefill(seq.reuse_prefix(ids))
    run = m.decoding(ids, params, stops, max_tokens, context_shift=sinks is not None, guide=guide, bias=bias)
    first = run.next(logits, seq.n_past)
    if first.text:
        yield first.text
    if first.finish_reason:
        return
    ln = lane(spec, seq, run, params, step_cost(m, seq, first.token))
    ln.pending = first.token
    held = None  # positions the sequence should hold if the caller stops now
    try:
        for _, got, n_past in rounds(m, [ln], stats, sinks):
            held = n_past
            if got.text:
                yield got.text
        held = None
    finally:
        ln.close()
        if held is not None and not seq.closed and seq.n_past > held:
            ln.back_to(held)


def decode_wave(model, wave, ids, params, stops, max_tokens: int, out: list[str], sinks: int | None,
                spec: Speculation, stats: SpecStats, guides: list, bias) -> None:
    """generate_batch's wave with speculation: every sequence's rounds share each step."""
    lanes: list[Lane] = []
    try:
        for i, s in wave:
            run = model.decoding(ids[i], params[i], stops, max_tokens, context_shift=sinks is not None,
                                 guide=guides[i], bias=bias)
            first = run.next(s.prefill(ids[i]), s.n_past)
            out[i] += first.text
            ln = lane(spec, s, run, params[i], step_cost(model, s, first.token or 0))
            ln.pending, ln.done, ln.index = first.token, first.finish_reason is not None, i
            lanes.append(ln)
        for ln, got, _ in rounds(model, lanes, stats, sinks):
            out[ln.index] += got.text
    finally:
        for ln in lanes:
            ln.close()
