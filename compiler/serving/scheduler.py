"""The scheduler: continuous batching over a Model.

Each step serves the next token of every running request and, under the step's row budget
(the model's batch_tokens), prefill chunks of the others, oldest first. Requests join between
steps, and a finished one closes its sequence at once. When the pool is out of pages the
scheduler evicts cached prefixes, then preempts the newest running request: its pages go back
and it is recomputed later (from the prefix cache where it can), its sampler state kept, so its
output is what it would have been. A cancelled request (its client went away) is closed at the
next step. A failure in one request's sampling, stop strings or client callback ends that
request alone.

A constrained request's mask may come after its logits (late_masks.py); a mask that takes longer
than MASK_TIMEOUT, or a constraint that allows no token, ends its request.
"""
from __future__ import annotations

import collections
import logging
import math
import threading
import time
from typing import Callable

import numpy as np

from ..core.errors import KilnError
from ..core.sequences import common_prefix
from ..planner.kv_plan import window_pages
from ..runtime import DeadEnd, Model, ModelError, PoolFullError, Sequence
from ..runtime.speculation import Speculation
from .late_masks import LateMasks
from .metrics import Metrics
from .state_cache import Snapshots, StateCache
from .radix_cache import Match, RadixCache
from .speculating import Speculating
from .types import Event, QueueFull, Request, TokenLogprob, Usage

log = logging.getLogger("kiln.serve")


class Scheduler(Speculating, LateMasks):
    """Which requests run in each step, and what becomes of them. Used from the engine thread only
    (but for the counts behind _lock, which callers read)."""

    def __init__(self, model: Model, prefix_cache: bool, metrics: Metrics, sinks: int | None,
                 speculation: Speculation | None = None, snapshots: Snapshots | None = None):
        self.model, self.metrics = model, metrics
        self.sinks = sinks  # None: a full context ends a request; else the sinks a context shift keeps
        self.n_slots, self.budget = model.options.n_seq, model.options.batch_tokens
        if self.budget < self.n_slots:
            raise KilnError(f"batch_tokens ({self.budget}) must be at least n_seq ({self.n_slots}), so that one "
                            "step can serve every running request (--batch-tokens)")
        # a hybrid's sequences cannot take a prefix's pages without its recurrent state: no prefix cache
        self.cache = RadixCache(model) if prefix_cache and not model.recurrent else None
        # ... it snapshots whole states instead, at token boundaries (state_cache.py)
        self.states = StateCache(model, snapshots or Snapshots()) if prefix_cache and model.recurrent else None
        self.waiting: collections.deque[Request] = collections.deque()
        self.running: list[Request] = []
        self._queued = 0  # submitted and not yet admitted
        self._lock = threading.Lock()
        self._admitted = 0
        self.slots: dict[int, list[int]] = {}  # sequence slot -> the tokens of the last request it served
        self.private: dict[int, tuple[list[int], np.ndarray]] = {}  # slot -> a restored cache of its own
        self._init_speculation(speculation)  # speculating.py (kiln serve --spec)

    # -- the slots' own caches (slots.py restores them) ------------------------------------------
    def keep_private(self, slot: int, tokens: list[int], pages: np.ndarray) -> None:
        """On the engine thread: hold `pages` (references taken for us) as slot's own cache of
        `tokens`, for requests that name the slot; what it held before is let go."""
        old = self.private.pop(slot, None)
        if old is not None:
            self.model.release_pages(old[1])
        if len(tokens):
            self.private[slot] = (tokens, pages)

    def drop_private(self) -> None:
        for _, pages in self.private.values():
            self.model.release_pages(pages)
        self.private.clear()

    def _private_match(self, r: Request, ids: list[int]) -> Match | None:
        """The slot's own cache, where r names the slot and its prompt starts with those tokens."""
        own = self.private.get(r.id_slot) if r.id_slot is not None else None
        if own is None or self.model.recurrent:
            return None
        tokens, pages = own
        n = min(common_prefix(tokens, ids), len(ids) - 1) // self.model.page_size
        return Match(list(tokens[:n * self.model.page_size]), pages[:n], None) if n else None

    def open_sequence(self, make: Callable[[], Sequence]) -> Sequence:
        """On the engine thread, a sequence for a slot action; QueueFull while every slot or page
        is taken by requests."""
        if len(self.running) >= self.n_slots:
            raise QueueFull(f"all {self.n_slots} sequences are serving requests")
        try:
            return make()
        except PoolFullError as e:
            raise QueueFull(str(e)) from None

    def _admit(self) -> None:
        """Open sequences for waiting requests, oldest first, while a slot is free and the pool has
        room for the request's prompt plus a page for each running one (so that a request just
        preempted is not readmitted into the same shortage)."""
        while self.waiting and len(self.running) < self.n_slots:
            r = self.waiting[0]
            # after a preemption, the output so far is recomputed too (or what a shifted sequence held)
            ids = r.resume if r.resume is not None else r.prompt_ids + r.output
            own = self._private_match(r, ids)
            held = own or (self.cache.match(ids) if self.cache else None)
            snap = self.states.match(ids) if self.states else None
            r.private = r.private or own is not None  # it read the slot's own cache: never shared on
            cached = len(held.tokens) if held else len(snap.tokens) if snap else 0
            if self._soon_cached(ids) > cached + self.model.page_size:
                self._release(held)  # wait for it rather than compute it twice
                return
            short = self._pages_short(len(ids) - (0 if snap else cached))  # a restored snapshot's pages are copies
            if short and self.cache:
                short = max(0, short - self.cache.evict(short))
            seq = None
            if not short:
                try:
                    seq = self.model.sequence(held.pages, held.tokens) if held else \
                        self.states.restore(snap) if snap else self.model.sequence()
                except ModelError:
                    pass
            if seq is None:
                self._release(held)
                if not self.running and short:  # nothing running will give pages back
                    self.waiting.popleft()
                    with self._lock:
                        self._queued -= 1
                    self._finish(r, error=f"the request needs {len(ids) - cached} positions of KV cache, more than "
                                          f"the pool's free pages hold; restart the server with more --kv-pages")
                return
            self.waiting.popleft()
            r.seq, r.held, r.todo = seq, held, ids[cached:]
            if r.cached_tokens is None:
                r.cached_tokens = cached
                self.metrics.prefix_query(len(ids), cached)
                if self.states:
                    (self.metrics.snapshot_hits if snap else self.metrics.snapshot_misses).inc()
            self._admitted += 1
            r.order = self._admitted
            with self._lock:
                self.running.append(r)
                self._queued -= 1

    def _release(self, held: Match | None) -> None:
        """Unlock a prefix the request held (a slot's own cache has no lock to undo)."""
        if held is not None and self.cache:
            self.cache.release(held)

    def _soon_cached(self, ids: list[int]) -> int:
        """How much of ids a running request is prefilling now, and will put in the prefix cache
        (SGLang's in-batch prefix sharing: several requests with one system prompt arrive
        together, and only the first computes it)."""
        if not self.cache:
            return 0
        best = 0
        for r in self.running:
            if r.output or len(r.todo) <= 1:
                continue
            n = common_prefix(ids, r.prompt_ids)
            best = max(best, min(n, len(ids) - 1) // self.model.page_size * self.model.page_size)
        return best

    def _pages_short(self, n_new: int) -> int:
        """How many pages some group lacks for n_new more positions of one sequence, keeping a
        page per running request in hand."""
        stats, ps, short = self.model.kv_stats()["groups"], self.model.page_size, 0
        for g in stats:
            need = -(-n_new // ps) + 1
            if g["window"]:  # a sliding group holds no more than the planner's bound, whatever n_new
                need = window_pages(g["window"], self.budget, ps, max_blocks=need)
            short = max(short, need + len(self.running) - g["pages_free"])
        return short

    def _step(self) -> None:
        self._sample_late()
        if self.sinks is not None:
            for r in self.running:
                if len(r.todo) == 1 and r.seq.n_past >= self.model.n_ctx:
                    try:
                        r.seq.shift_if_full(self.sinks)
                    except PoolFullError:  # its shared pages must be copied: free some, try again
                        self._make_room([(r, r.todo)])
                        return
                    self.metrics.shifted()
        budget, items = self.budget, []
        for r in sorted(self.running, key=lambda r: (len(r.todo) > 1, r.order)):  # decodes first, then oldest
            if budget == 0:
                break
            if r.pending is not None:  # waits for its constraint's mask
                continue
            chunk = r.todo[:budget]
            if self.states and len(r.todo) > 1:  # a prompt's chunk ends where a snapshot is due
                chunk = chunk[:self.states.cut(r.seq.n_past, len(chunk))]
            items.append((r, chunk))
            budget -= len(chunk)
        if not items:
            self._await_masks()
            return
        if self.speculation is not None:
            items = self._drafts_for(items, budget)
        started = time.monotonic()
        try:
            if self.speculation is not None:
                rows = self._step_speculating(items)
            else:  # logits only where a request samples: a prompt's chunk before its last has none
                need = [len(chunk) == len(r.todo) for r, chunk in items]
                got = iter(self.model.step([(r.seq, chunk) for r, chunk in items], need))
                rows = [next(got) if n else None for n in need]
        except PoolFullError:
            self._make_room(items)
            return
        for r, _ in items:  # the masks of the rows about to sample, computed while the cores are free
            if r.decoding.guide is not None:
                r.decoding.guide.start()
        now = time.monotonic()
        self._grace_after(started, now)
        for (r, chunk), logits in zip(items, rows):
            r.todo = r.todo[len(chunk):]
            if self.cache and len(chunk) > 1 and not r.private:  # share a prompt's pages as they fill
                r.held = self.cache.insert(r.seq, r.held)
            if self.states and len(chunk) > 1 and (not r.todo or r.seq.n_past % self.states.interval == 0):
                self._snapshot(r)  # at each interval of a prompt, and at its end
            if not r.todo:
                self._verify(r, logits) if self._verifies(r) else self._sample(r, logits)

    def _snapshot(self, r: Request) -> None:
        taken = self.states.taken
        self.states.take(r.seq)
        self.metrics.snapshots_taken.inc(self.states.taken - taken)

    def _sample(self, r: Request, logits: np.ndarray) -> None:
        """The request's next token; a failure here (its sampler, its stop strings, its client's
        callback) ends this request alone. A row whose constraint's mask is not ready keeps its
        logits for a later round (_sample_late)."""
        if not self._mask_ready(r):
            r.pending = logits
            self.metrics.mask_late.inc()
            return
        try:
            self._sample_one(r, logits)
            guide = r.decoding.guide
            if guide is not None and (seconds := guide.take_seconds()) is not None:
                self.metrics.mask_seconds.observe(seconds)
        except DeadEnd as e:
            self.metrics.dead_ends.inc()
            if not r.done:
                self._finish(r, error=str(e), invalid=True)
        except Exception as e:
            log.exception("a request failed while sampling")
            if not r.done:
                self._finish(r, error=f"the request failed: {e}")

    def _sample_one(self, r: Request, logits: np.ndarray) -> None:
        self._deliver(r, r.decoding.next(logits, r.seq.n_past), logits)

    def _deliver(self, r: Request, got, logits: np.ndarray) -> None:
        """A sampled token (from these logits) to the request's client, and the request's end."""
        now = time.monotonic()
        self.metrics.token_emitted(now - (r.last_token_at or r.arrival), first=r.last_token_at is None)
        r.last_token_at = now
        if got.token is not None:
            r.output.append(got.token)
        lp = TokenLogprob.of(logits, got.token, r.logprobs) if r.logprobs is not None and got.token is not None else None
        r.emit(Event(text=got.text, token=got.token, logprob=lp))
        if got.finish_reason:
            self._finish(r, reason=got.finish_reason)
        else:
            r.todo = [got.token]

    def _finish(self, r: Request, reason: str | None = None, error: str | None = None, cancelled: bool = False,
                invalid: bool = False) -> None:
        """Take r out of the engine; its sequence's full pages stay in the prefix cache."""
        if r.seq is not None:
            self.slots[r.seq.id] = list(r.seq.tokens)
            if self.states and not cancelled and not error:  # a conversation's next turn starts with all of it
                self._snapshot(r)
            if self.cache and not cancelled and not error and r.seq.exact and not r.private:  # (a shifted one is no prefix's)
                r.held = self.cache.insert(r.seq, r.held)
            self._release(r.held)
            r.seq.close()
            r.seq, r.held = None, None
        with self._lock:
            if r in self.running:
                self.running.remove(r)
        r.done = True
        if cancelled:
            return
        try:  # the client's callback: its failure is its own
            if error:
                r.emit(Event(error=error, invalid=invalid))
            else:
                r.emit(Event(finish_reason=reason, usage=Usage(len(r.prompt_ids), len(r.output), r.cached_tokens or 0)))
        except Exception:
            log.exception("a request's last event could not be delivered")

    def _make_room(self, items) -> None:
        """The step did not fit in the pool: free pages, then the loop tries again."""
        need = sum(math.ceil(len(c) / self.model.page_size) + 1 for _, c in items)
        if self.cache and self.cache.evict(need):
            return
        if len(self.running) > 1:
            self._preempt(max(self.running, key=lambda r: r.order))
            return
        if self.cache and self.cache.evict(need, locked_too=True):
            return
        r = self.running[0]
        self._finish(r, error=f"the KV pool cannot hold this request ({len(r.prompt_ids) + len(r.output)} tokens "
                              f"in pages of {self.model.page_size}); restart the server with more --kv-pages")

    def _preempt(self, r: Request) -> None:
        if not r.seq.exact:
            r.resume = r.seq.tokens + r.todo
        self._release(r.held)
        r.seq.close()
        r.seq, r.held, r.todo, r.pending = None, None, [], None  # its logits are recomputed on readmission
        with self._lock:
            self.running.remove(r)
            self._queued += 1
        self.waiting.appendleft(r)
        self.metrics.preempted()

