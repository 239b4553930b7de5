"""The serving engine: the scheduler (scheduler.py) run by one thread, and what callers on other
threads may do: submit a request, cancel it, run a slot action between steps, read the stats.

Callers talk to the thread through a queue and get events through a callback, which runs on the
engine thread and must not block. Everything the thread does is guarded: a fault in one round
fails the requests running in it and is counted; a thread that dies anyway says so (alive, the
health route) and fails what waits, so that no client hangs.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from concurrent.futures import Future
from contextlib import contextmanager
from typing import Callable, Iterator

from ..core.errors import KilnError
from ..runtime import Model
from ..runtime.embedding import hidden_states
from ..runtime.speculation import Speculation
from .metrics import Metrics
from .scheduler import Scheduler
from .state_cache import Snapshots
from .types import EngineStats, QueueFull, Request

log = logging.getLogger("kiln.serve")


class Engine(Scheduler):
    """The scheduler on a thread of its own, and the callers' side: submit, cancel, call, stats."""

    def __init__(self, model: Model, max_queue: int = 64, prefix_cache: bool = True,
                 metrics: Metrics | None = None, context_shift: bool = False, sinks: int = 4,
                 speculation: Speculation | None = None, snapshots: Snapshots | None = None):
        super().__init__(model, prefix_cache, metrics or Metrics(), sinks if context_shift else None, speculation,
                         snapshots)
        self.max_queue = max_queue
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name="kiln-engine", daemon=True)
        self._failed, self.faults = False, 0  # the thread died; rounds that failed (kiln_engine_faults)
        self._embeds: list[tuple[list[list[int]], str, Future]] = []  # requests' inputs for the next round
        self._publish()
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
        """Queue r, or raise: KilnError for a request that can never run (nothing is counted),
        QueueFull when the queue is at its limit or the engine is down."""
        if len(r.prompt_ids) >= self.model.n_ctx and self.sinks is None:
            raise KilnError(f"the prompt has {len(r.prompt_ids)} tokens; the context holds {self.model.n_ctx}, "
                            "and at least one must be left to generate")
        # everything that can refuse the request runs before it is counted
        r.decoding = self.model.decoding(r.prompt_ids, r.params, r.stops, r.max_tokens, r.ignore_eos,
                                          context_shift=self.sinks is not None, guide=r.guide, bias=r.bias,
                                          thinking=r.thinking, special=r.special)
        with self._queue_slot():
            self._inbox.put(("submit", r))
        if r.guide is not None:
            self.metrics.constrained.inc()

    @contextmanager
    def _queue_slot(self) -> Iterator[None]:
        """Count one waiting item for the body of the block; uncounted again if the block raises."""
        with self._lock:
            if not self.alive:
                raise QueueFull("the engine has stopped; see the server's log")
            if self._queued >= self.max_queue:
                raise QueueFull(f"{self._queued} requests are waiting (the limit, --max-queue)")
            self._queued += 1
        try:
            yield
        except BaseException:
            with self._lock:
                self._queued -= 1
            raise

    def has_room(self) -> bool:
        """Whether a request would be queued now (checked again when it is submitted)."""
        with self._lock:
            return self.alive and self._queued < self.max_queue

    @property
    def alive(self) -> bool:
        """Not yet started, or its thread going round its loop."""
        return not self._failed and (self._thread.ident is None or self._thread.is_alive())

    def cancel(self, r: Request) -> None:
        self._inbox.put(("cancel", r))

    def call(self, fn: Callable[[], object]) -> Future:
        """Run fn on the engine thread between steps (it owns the model); its result or exception.
        It takes a place in the queue until it has run; QueueFull when there is none."""
        done: Future = Future()
        with self._queue_slot():
            self._inbox.put(("call", (fn, done)))
        return done

    def embed(self, ids: list[list[int]], kind: str) -> Future:
        """Queue a request's inputs (token ids, each checked) for the next embedding round, which
        packs the inputs of every request then waiting into shared steps (runtime/embedding.py); the
        future gets this request's hidden rows, one array an input. QueueFull when there is no room."""
        done: Future = Future()
        with self._queue_slot():
            self._inbox.put(("embed", (ids, kind, done)))
        return done

    def stats(self) -> EngineStats:
        """The engine as of its last loop, for /metrics: a snapshot, so a scrape never waits on a step."""
        return self._stats

    def heartbeat_age(self) -> float:
        """Seconds since the engine thread last went round its loop (it does at least once a second)."""
        return time.monotonic() - self._heartbeat

    def _publish(self) -> None:
        kv = self.model.kv_stats()
        with self._lock:
            running, waiting = len(self.running), self._queued
        self._stats = EngineStats(kv["pages_total"], kv["pages_used"], kv["utilization"],
                                  self.cache.pages_held if self.cache else 0,
                                  self.cache.evicted_pages if self.cache else 0, running, waiting, self.faults,
                                  self.states.bytes if self.states else 0, len(self.states.entries) if self.states else 0)
        self._heartbeat = time.monotonic()

    # -- the engine thread ------------------------------------------------------------------
    def _loop(self) -> None:
        try:
            while self._turn():
                pass
        except BaseException:  # not even a fault could be handled: the engine is down, and says so
            log.exception("the engine thread died")
            self._failed = True
            self._fail_all("the server's engine has stopped")

    def _turn(self) -> bool:
        """One round: take what the callers sent, admit, step. False once asked to stop. A fault
        in one round fails the requests that were running, counts it, and the loop goes on."""
        try:
            idle = not self.running and not self.waiting
            try:
                while True:  # idle, wake at least once a second so that the heartbeat stays fresh
                    kind, r = self._inbox.get(block=idle, timeout=1.0 if idle else None)
                    idle = False
                    if kind == "stop":
                        self._shutdown()
                        return False
                    self._take(kind, r)
            except queue.Empty:
                pass
            self._admit()
            if self._embeds:
                self._embed_round()
            if self.running:
                self._step()
        except Exception as e:  # a bug, not a request's fault: fail what is running, keep serving
            log.exception("engine step failed")
            self.faults += 1
            self._fail_all(f"internal error: {e}", waiting=False)
        if self.cache:
            self.metrics.evictions(self.cache.evicted_pages)
        self._publish()
        return True

    def _fail_all(self, error: str, waiting: bool = True) -> None:
        """Fail the running requests; with `waiting`, also what waits and what is still in the inbox."""
        victims = list(self.running)
        if waiting:
            while True:
                try:
                    kind, item = self._inbox.get_nowait()
                except queue.Empty:
                    break
                if kind == "submit":
                    self.waiting.append(item)
                elif kind in ("call", "embed"):
                    item[-1].set_exception(QueueFull(error))
            victims += list(self.waiting)
            self.waiting.clear()
            with self._lock:
                self._queued = 0
        for *_, done in self._embeds:
            done.set_exception(QueueFull(error))
        self._embeds.clear()
        for r in victims:
            if not r.done:
                try:
                    self._finish(r, error=error)
                except Exception:
                    log.exception("finishing a request failed")
                    r.done = True

    def _take(self, kind: str, r) -> None:
        if kind == "call":
            fn, done = r
            with self._lock:
                self._queued -= 1
            if done.set_running_or_notify_cancel():
                try:
                    done.set_result(fn())
                except BaseException as e:  # the caller hears it
                    done.set_exception(e)
        elif kind == "submit":
            self.waiting.append(r)
        elif kind == "embed":
            with self._lock:
                self._queued -= 1
            if r[-1].set_running_or_notify_cancel():
                self._embeds.append(r)
        elif kind == "cancel" and not r.done:
            if r in self.waiting:
                self.waiting.remove(r)
                with self._lock:
                    self._queued -= 1
                r.done = True
            else:
                self._finish(r, cancelled=True)

    def _embed_round(self) -> None:
        """Every waiting request's inputs, pooled the same way, in one packing of steps; each
        request gets its own inputs' rows. A failure fails that round's requests alone."""
        jobs, self._embeds = self._embeds, []
        for kind in dict.fromkeys(k for _, k, _ in jobs):
            group = [(ids, done) for ids, k, done in jobs if k == kind]
            flat = [x for ids, _ in group for x in ids]
            try:
                rows = hidden_states(self.model, flat, kind)
            except Exception as e:
                log.exception("an embedding round failed")
                for _, done in group:
                    done.set_exception(e)
                continue
            self.metrics.embedded(len(flat), sum(map(len, flat)))
            at = 0
            for ids, done in group:
                done.set_result(rows[at:at + len(ids)])
                at += len(ids)

    def _shutdown(self) -> None:
        for r in list(self.running) + list(self.waiting):
            if not r.done:
                self._finish(r, error="the server is shutting down")
        self.drop_private()
        if self.cache:
            self.cache.clear()

