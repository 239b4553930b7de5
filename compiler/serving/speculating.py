"""The scheduler's speculative decoding (kiln serve --spec ngram): a decoding request's step
carries its current token and the tokens prompt lookup drafts for it, beside every other
request's rows, and the verified tokens go out one event each.

Drafts use only the rows a step has left once every decode and prompt chunk has its own, so
they never delay another request. How many a request drafts follows its recent acceptance and
what a row costs beside the step's others (runtime/speculation.py): a step that already yields
eight tokens pays for a draft only where it is likely to hold. A request opts out with
"speculative": false; a constrained one never drafts (its mask is computed one token at a time).
The output is what plain decoding gives (speculation.py), so the prefix cache, preemption and
the slot files see exactly the tokens they would without speculation.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np

from ..runtime import PoolFullError
from ..runtime.spec_decode import calibrate
from ..runtime.speculation import LookupDrafts, Speculation, draft_room, verify
from .types import Request

log = logging.getLogger("kiln.serve")


@dataclass(eq=False)
class Drafting:
    """A request's speculation: its prompt lookup and draft length with this step's drafts."""
    ngram: LookupDrafts
    verifying: bool = False  # this step's rows are to be verified
    mark: object = None  # a hybrid's sequence before a step with drafts (Sequence.mark), to rewind to
    fed: list[int] = field(default_factory=list)  # the rows that step fed: its current token and drafts


class Speculating:
    """Mixed into the Scheduler: what --spec adds to a step."""

    speculation: Speculation | None = None

    def _init_speculation(self, speculation: Speculation | None) -> None:
        self.speculation = speculation
        self.spec_cost = calibrate(self.model) if speculation is not None else None

    def _drafts_for(self, items: list[tuple[Request, list[int]]], budget: int) -> list[tuple[Request, list[int]]]:
        """The step's items, with drafts after the current token of each request that speculates,
        within the `budget` rows the step has left."""
        decodes = sum(1 for r, chunk in items if len(chunk) == 1 and len(r.todo) == 1)
        rows = sum(len(chunk) for _, chunk in items)
        out = []
        for r, chunk in items:
            if not (r.speculative and r.decoding.guide is None and r.output and len(r.todo) == 1 == len(chunk)):
                if r.spec is not None:
                    r.spec.verifying = False
                out.append((r, chunk))
                continue
            d = r.spec
            if d is None:
                d = r.spec = Drafting(LookupDrafts(r.decoding.history, self.speculation.max_draft, self.spec_cost))
            drafts = d.ngram.draft(min(draft_room(self.model, r.seq.n_past, rewinds=True), budget), decodes, rows)
            d.verifying = True
            # a hybrid's state cannot be rolled back past a failed draft: it is saved, to rewind to
            d.mark = r.seq.mark() if self.model.recurrent and drafts else None
            d.fed = chunk + drafts
            budget -= len(drafts)
            out.append((r, chunk + drafts))
        return out

    def _step_speculating(self, items: list[tuple[Request, list[int]]]) -> list[np.ndarray]:
        """The step, every row's logits kept for requests that verify drafts: [rows, vocab] for
        those, [vocab] for the others. Without the pages for the drafts, the step runs without
        them (items are changed in place) before the scheduler makes room."""
        def run():
            every = [r.spec is not None and r.spec.verifying and len(chunk) > 1 for r, chunk in items]
            got = self.model.step_rows([(r.seq, chunk) for r, chunk in items], every)
            return [rows if wide else rows[-1] for rows, wide in zip(got, every)]
        try:
            return run()
        except PoolFullError:
            drafted = [(r, chunk) for r, chunk in items if r.spec is not None and r.spec.ngram.drafts]
            if not drafted:
                raise
            for i, (r, chunk) in enumerate(items):
                if r.spec is not None and r.spec.ngram.drafts:
                    items[i] = (r, chunk[:len(chunk) - len(r.spec.ngram.drafts)])
                    r.spec.ngram.drop()
                    r.spec.mark = None
            return run()

    def _verifies(self, r: Request) -> bool:
        return r.spec is not None and r.spec.verifying

    def _verify(self, r: Request, logits: np.ndarray) -> None:
        """The tokens a request's step yields (its rows' logits: [1 + drafts, vocab], or [vocab]
        without drafts); the sequence keeps the positions of those that hold. A failure ends
        this request alone."""
        d = r.spec
        d.verifying = False
        rows = logits.reshape(-1, logits.shape[-1])
        n_before = r.seq.n_past - len(rows)
        try:
            got, accepted = verify(r.decoding, d.ngram.drafts, rows, n_before)
        except Exception as e:
            log.exception("a request failed while verifying its drafts")
            self._finish(r, error=f"the request failed: {e}")
            return
        if n_before + len(got) < r.seq.n_past:
            if d.mark is not None:  # the kept rows run again from the saved state
                r.seq.back_to(d.mark, d.fed[:len(got)])
            else:
                r.seq.rollback(n_before + len(got))
        d.mark = None
        d.ngram.observe(accepted, got[0].token)
        self.metrics.speculated(len(d.ngram.drafts), accepted, len(got))
        for token, row in zip(got, rows):
            if r.done:
                return
            try:
                self._deliver(r, token, row)
            except Exception as e:
                log.exception("a request failed while taking its tokens")
                if not r.done:
                    self._finish(r, error=f"the request failed: {e}")
