"""Constrained rows whose masks come late: mixed into the Scheduler.

A constrained request's next mask is computed on a worker thread, while the step runs or right
after it (runtime/constraints.py). A row whose mask is not ready when the step's logits are is
waited for up to half the step's time, then keeps its logits and is sampled in a later round; the
step does not wait longer for it, so one slow grammar slows its own request alone. A mask that
takes longer than MASK_TIMEOUT ends its request.
"""
from __future__ import annotations

import time
from concurrent.futures import FIRST_COMPLETED, wait

from ..runtime.constraints import MASK_TIMEOUT
from .types import Request

# After a step the engine waits, in all, this share of the step's time (at least MASK_GRACE_MIN
# seconds) for masks not yet computed: a normal mask is far shorter, even on a loaded machine whose
# steps are slow too, and a slow grammar costs the other requests at most that share.
MASK_GRACE_SHARE, MASK_GRACE_MIN = 0.5, 0.002


class LateMasks:
    """The rows of `self.running` whose `pending` logits wait for their mask."""

    def _grace_after(self, started: float, now: float) -> None:
        """The masks of a step that started at `started` and ended `now` are waited for until then."""
        self._grace_until = now + max(MASK_GRACE_MIN, MASK_GRACE_SHARE * (now - started))

    def _sample_late(self) -> None:
        """Sample the rows whose mask has come since their logits did; end one whose mask has taken
        longer than MASK_TIMEOUT (its grammar's fault, not the server's)."""
        for r in [r for r in self.running if r.pending is not None]:
            if r.decoding.ready():
                logits, r.pending = r.pending, None
                self._sample(r, logits)
            elif r.decoding.guide.waited() > MASK_TIMEOUT:
                r.pending = None
                self.metrics.dead_ends.inc()
                self._finish(r, error=f"{r.decoding.guide.constraint.name}: the constraint took longer than "
                                      f"{MASK_TIMEOUT:g} s to compute one token's mask", invalid=True)

    _grace_until = 0.0  # until when, after the last step, a row's mask is waited for

    def _mask_ready(self, r: Request) -> bool:
        """Whether r's constraint's mask is computed, waiting for it until this round's grace ends."""
        future = r.decoding.guide.waiting() if r.decoding.guide is not None else None
        if future is None or future.done():
            return True
        left = self._grace_until - time.monotonic()
        if left > 0:
            wait([future], timeout=left)
        return future.done()

    def _await_masks(self) -> None:
        """Every running row waits for its mask: wait for the first (briefly, so that the engine
        still takes its inbox and counts its heartbeat)."""
        futures = [f for r in self.running if r.pending is not None and (f := r.decoding.guide.waiting()) is not None]
        if futures:
            wait(futures, timeout=0.05, return_when=FIRST_COMPLETED)
