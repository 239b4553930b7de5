"""The serving engine: one thread runs continuous batching over a Model.

Each step serves the next token of every running request and, under the step's row budget
(the model's batch_tokens), prefill chunks of the others, oldest first. Requests join between
steps, and a finished one closes its sequence at once. When the pool is out of pages the engine
evicts cached prefixes, then preempts the newest running request: its pages go back and it is
recomputed later (from the prefix cache where it can), its sampler state kept, so its output
is what it would have been. A cancelled request (its client went away) is closed at the next
step. Callers talk to the thread through a queue and get events through a callback, which
runs on the engine thread and must not block.
"""
from __future__ import annotations

import collections
import logging
import math
import queue
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Callable

import numpy as np

from ..core.errors import KilnError
from ..core.sequences import common_prefix
from ..planner.kv_plan import window_pages
from ..runtime import Model, ModelError, PoolFullError, Sequence
from .metrics import Metrics
from .radix_cache import RadixCache
from .types import EngineStats, Event, QueueFull, Request, TokenLogprob, Usage

log = logging.getLogger("kiln.serve")


class Engine:
    def __init__(self, model: Model, max_queue: int = 64, prefix_cache: bool = True,
                 metrics: Metrics | None = None, context_shift: bool = False, sinks: int = 4):
        self.model = model
        self.sinks = sinks if context_shift else None  # None: a full context ends a request
        self.n_slots, self.budget = model.options.n_seq, model.options.batch_tokens
        if self.budget < self.n_slots:
            raise KilnError(f"batch_tokens ({self.budget}) must be at least n_seq ({self.n_slots}), so that one "
                            "step can serve every running request (--batch-tokens)")
        self.max_queue = max_queue
        self.cache = RadixCache(model) if prefix_cache else None
        self.metrics = metrics or Metrics()
        self.waiting: collections.deque[Request] = collections.deque()
        self.running: list[Request] = []
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._queued = 0  # submitted and not yet admitted
        self._lock = threading.Lock()
        self._admitted = 0
        self.slots: dict[int, list[int]] = {}  # sequence slot -> the tokens of the last request it served
        self._thread = threading.Thread(target=self._loop, name="kiln-engine", daemon=True)
        self.metrics.watch(self.stats)

    # -- the callers' side (any thread) -----------------------------------------------------
    def start(self) -> "Engine":
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread.is_alive():
            self._inbox.put(("stop", None))
            self._thread.join()

    def submit(self, r: Request) -> None:
        if len(r.prompt_ids) >= self.model.n_ctx:
            raise KilnError(f"the prompt has {len(r.prompt_ids)} tokens; the context holds {self.model.n_ctx}, "
                            "and at least one must be left to generate")
        with self._lock:
            if self._queued >= self.max_queue:
                raise QueueFull(f"{self._queued} requests are waiting (the limit, --max-queue)")
            self._queued += 1
        r.decoding = self.model.decoding(r.prompt_ids, r.params, r.stops, r.max_tokens, r.ignore_eos,
                                          context_shift=self.sinks is not None)
        self._inbox.put(("submit", r))

    def cancel(self, r: Request) -> None:
        self._inbox.put(("cancel", r))

    def call(self, fn: Callable[[], object]) -> Future:
        """Run fn on the engine thread between steps (it owns the model); its result or exception."""
        done: Future = Future()
        self._inbox.put(("call", (fn, done)))
        return done

    # -- KV state files: llama-server's /slots save and restore --------------------------------
    def save_slot(self, slot: int, path: Path) -> tuple[int, int]:
        """On the engine thread: the cache of the last request slot `slot` served, rebuilt from the
        prefix cache and a prefill of the rest, into a file. (tokens, bytes written)."""
        tokens = self.slots.get(slot)
        if not tokens:
            raise KilnError(f"slot {slot} has served no request yet: nothing to save")
        held = self.cache.match(tokens) if self.cache else None
        seq = None
        try:
            seq = self._open(lambda: self.model.sequence(held.pages, held.tokens) if held else self.model.sequence())
            if seq.n_past < len(tokens):
                seq.prefill(tokens[seq.n_past:])
            return len(tokens), seq.save(path)
        finally:
            if seq is not None:
                seq.close()
            if held:
                self.cache.release(held)

    def restore_slot(self, slot: int, path: Path) -> tuple[int, int]:
        """On the engine thread: a saved cache into the prefix cache (a request that starts with its
        tokens reads them from there), and into the slot's record. (tokens, bytes read)."""
        seq = self._open(lambda: self.model.sequence_from(path))
        try:
            if self.cache and seq.exact:
                self.cache.release(self.cache.insert(seq, None))
            self.slots[slot] = list(seq.tokens)
            return seq.n_past, path.stat().st_size
        finally:
            seq.close()

    def stats(self) -> EngineStats:
        """The engine now, for /metrics (any thread)."""
        kv = self.model.kv_stats()
        with self._lock:
            running, waiting = len(self.running), self._queued
        return EngineStats(kv["pages_total"], kv["pages_used"], kv["utilization"],
                           self.cache.pages_held if self.cache else 0, self.cache.evicted_pages if self.cache else 0,
                           running, waiting)

    # -- the engine thread ------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            idle = not self.running and not self.waiting
            try:
                while True:
                    kind, r = self._inbox.get(block=idle, timeout=None)
                    idle = False
                    if kind == "stop":
                        self._shutdown()
                        return
                    self._take(kind, r)
            except queue.Empty:
                pass
            try:
                self._admit()
                if self.running:
                    self._step()
            except Exception as e:  # a bug: fail what is running, keep serving
                log.exception("engine step failed")
                for r in list(self.running):
                    self._finish(r, error=f"internal error: {e}")
            if self.cache:
                self.metrics.evictions(self.cache.evicted_pages)

    def _open(self, make: Callable[[], Sequence]) -> Sequence:
        """A sequence for a slot action; QueueFull while every slot or page is taken by requests."""
        if len(self.running) >= self.n_slots:
            raise QueueFull(f"all {self.n_slots} sequences are serving requests")
        try:
            return make()
        except PoolFullError as e:
            raise QueueFull(str(e)) from None

    def _take(self, kind: str, r) -> None:
        if kind == "call":
            fn, done = r
            if done.set_running_or_notify_cancel():
                try:
                    done.set_result(fn())
                except BaseException as e:  # the caller hears it
                    done.set_exception(e)
        elif kind == "submit":
            self.waiting.append(r)
        elif kind == "cancel" and not r.done:
            if r in self.waiting:
                self.waiting.remove(r)
                with self._lock:
                    self._queued -= 1
                r.done = True
            else:
                self._finish(r, cancelled=True)

    def _shutdown(self) -> None:
        for r in list(self.running) + list(self.waiting):
            if not r.done:
                self._finish(r, error="the server is shutting down")
        if self.cache:
            self.cache.clear()

    def _admit(self) -> None:
        """Open sequences for waiting requests, oldest first, while a slot is free and the pool has
        room for the request's prompt plus a page for each running one (so that a request just
        preempted is not readmitted into the same shortage)."""
        while self.waiting and len(self.running) < self.n_slots:
            r = self.waiting[0]
            # after a preemption, the output so far is recomputed too (or what a shifted sequence held)
            ids = r.resume if r.resume is not None else r.prompt_ids + r.output
            held = self.cache.match(ids) if self.cache else None
            cached = len(held.tokens) if held else 0
            if self._soon_cached(ids) > cached + self.model.page_size:
                self.cache.release(held)  # wait for it rather than compute it twice
                return
            short = self._pages_short(len(ids) - cached)
            if short and self.cache:
                short = max(0, short - self.cache.evict(short))
            seq = None
            if not short:
                try:
                    seq = self.model.sequence(held.pages, held.tokens) if held else self.model.sequence()
                except ModelError:
                    pass
            if seq is None:
                if held:
                    self.cache.release(held)
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
            self._admitted += 1
            r.order = self._admitted
            with self._lock:
                self.running.append(r)
                self._queued -= 1

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
            chunk = r.todo[:budget]
            items.append((r, chunk))
            budget -= len(chunk)
        try:
            rows = self.model.step([(r.seq, chunk) for r, chunk in items])
        except PoolFullError:
            self._make_room(items)
            return
        for (r, chunk), logits in zip(items, rows):
            r.todo = r.todo[len(chunk):]
            if self.cache and len(chunk) > 1:  # share a prompt's pages as they fill, for requests deferred on it
                r.held = self.cache.insert(r.seq, r.held)
            if not r.todo:
                self._sample(r, logits)

    def _sample(self, r: Request, logits: np.ndarray) -> None:
        got = r.decoding.next(logits, r.seq.n_past)
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

    def _finish(self, r: Request, reason: str | None = None, error: str | None = None, cancelled: bool = False) -> None:
        """Take r out of the engine; its sequence's full pages stay in the prefix cache."""
        if r.seq is not None:
            self.slots[r.seq.id] = list(r.seq.tokens)
            if self.cache and not cancelled and not error and r.seq.exact:  # a shifted cache is no prefix's
                r.held = self.cache.insert(r.seq, r.held)
            if self.cache and r.held is not None:
                self.cache.release(r.held)
            r.seq.close()
            r.seq, r.held = None, None
        with self._lock:
            if r in self.running:
                self.running.remove(r)
        r.done = True
        if cancelled:
            return
        if error:
            r.emit(Event(error=error))
        else:
            r.emit(Event(finish_reason=reason, usage=Usage(len(r.prompt_ids), len(r.output), r.cached_tokens or 0)))

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
        if self.cache and r.held is not None:
            self.cache.release(r.held)
        r.seq.close()
        r.seq, r.held, r.todo = None, None, []
        with self._lock:
            self.running.remove(r)
            self._queued += 1
        self.waiting.appendleft(r)
        self.metrics.preempted()

