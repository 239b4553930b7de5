"""The server's Prometheus metrics, all in the kiln_ namespace, on a registry of its own (so that
several servers can live in one process). Counters and histograms are updated by the engine
thread as things happen; the gauges are read through the engine's stats() when /metrics is
scraped."""
from __future__ import annotations

from typing import Callable

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from ..runtime.speculation import SpecStats
from .types import EngineStats

_LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 30, 60)
_MASK_BUCKETS = (1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 0.01, 0.03, 0.1, 0.3, 1)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.prompt_tokens = Counter("kiln_prompt_tokens", "Prompt tokens of admitted requests", registry=r)
        self.generation_tokens = Counter("kiln_generation_tokens", "Tokens generated", registry=r)
        self.prefix_queries = Counter("kiln_prefix_cache_queries_tokens", "Prompt tokens looked up in the prefix cache",
                                      registry=r)
        self.prefix_hits = Counter("kiln_prefix_cache_hits_tokens", "Prompt tokens found in the prefix cache",
                                   registry=r)
        self.preemptions = Counter("kiln_preemptions", "Running requests preempted for lack of KV pages", registry=r)
        self.shifts = Counter("kiln_context_shifts", "Context shifts of running requests (--context-shift)", registry=r)
        self.evicted = Counter("kiln_prefix_cache_evicted_pages", "Pages evicted from the prefix cache", registry=r)
        self.snapshot_hits = Counter("kiln_state_snapshot_hits", "Requests that restored a hybrid's state snapshot",
                                     registry=r)
        self.snapshot_misses = Counter("kiln_state_snapshot_misses", "Requests of a hybrid with no state snapshot to "
                                       "restore", registry=r)
        self.snapshots_taken = Counter("kiln_state_snapshots_taken", "State snapshots taken (each a copy of a "
                                       "sequence's KV pages and recurrent state)", registry=r)
        self.ttft = Histogram("kiln_time_to_first_token_seconds", "Time from arrival to the first token",
                              buckets=_LATENCY_BUCKETS, registry=r)
        self.itl = Histogram("kiln_inter_token_latency_seconds", "Time between a request's tokens",
                             buckets=_LATENCY_BUCKETS, registry=r)
        self.constrained = Counter("kiln_constrained_requests", "Requests whose output a schema, grammar or tool "
                                   "call constrains", registry=r)
        self.mask_seconds = Histogram("kiln_constraint_mask_seconds", "A constrained token's mask: advancing the "
                                      "matcher and computing the next mask (on a worker thread)",
                                      buckets=_MASK_BUCKETS, registry=r)
        self.mask_late = Counter("kiln_constraint_mask_late", "Constrained tokens sampled a step late because "
                                 "their mask was not ready when the step's logits were", registry=r)
        self.dead_ends = Counter("kiln_constraint_dead_ends", "Requests ended because their constraint allowed "
                                 "no next token (a grammar's dead end, or one of llguidance's limits)", registry=r)
        self._stats: Callable[[], EngineStats] | None = None
        self.embedded_inputs = Counter("kiln_embedding_inputs", "Inputs embedded or scored (/v1/embeddings, "
                                       "/v1/rerank)", registry=r)
        self.embedded_tokens = Counter("kiln_embedding_tokens", "Tokens of the inputs embedded or scored", registry=r)
        self._evicted_seen = 0
        self.spec = SpecStats()  # speculative decoding (--spec): its counters and rates, read at scrape time
        r.register(self)

    # -- called by the engine thread ----------------------------------------------------------
    def prefix_query(self, prompt_tokens: int, hit_tokens: int) -> None:
        self.prompt_tokens.inc(prompt_tokens)
        self.prefix_queries.inc(prompt_tokens)
        self.prefix_hits.inc(hit_tokens)

    def token_emitted(self, seconds: float, first: bool) -> None:
        self.generation_tokens.inc()
        (self.ttft if first else self.itl).observe(seconds)

    def embedded(self, inputs: int, tokens: int) -> None:
        self.embedded_inputs.inc(inputs)
        self.embedded_tokens.inc(tokens)

    def shifted(self) -> None:
        self.shifts.inc()

    def preempted(self) -> None:
        self.preemptions.inc()

    def speculated(self, drafted: int, accepted: int, emitted: int) -> None:
        """One step of a request that speculates: tokens drafted, of them accepted, tokens emitted."""
        self.spec.add(drafted, accepted, emitted)

    def evictions(self, total: int) -> None:
        """The prefix cache's evictions so far; the counter takes what is new."""
        if total > self._evicted_seen:
            self.evicted.inc(total - self._evicted_seen)
            self._evicted_seen = total

    def watch(self, stats: Callable[[], EngineStats]) -> None:
        """Where the gauges are read from at scrape time."""
        self._stats = stats

    # -- a prometheus_client collector: the gauges, read at scrape time -------------------------
    def describe(self):
        return []

    def collect(self):
        if self._stats is None:
            return
        s = self._stats()
        yield GaugeMetricFamily("kiln_kv_pages_total", "KV pages in the pool (all layer groups)", s.pages_total)
        yield GaugeMetricFamily("kiln_kv_pages_used", "KV pages in use", s.pages_used)
        yield GaugeMetricFamily("kiln_kv_utilization", "Fraction of KV pages in use", s.utilization)
        yield GaugeMetricFamily("kiln_prefix_cache_pages", "Blocks held by the prefix cache", s.prefix_cache_pages)
        yield GaugeMetricFamily("kiln_state_snapshot_bytes", "Bytes of a hybrid's state snapshots held", s.snapshot_bytes)
        yield GaugeMetricFamily("kiln_state_snapshots", "A hybrid's state snapshots held", s.snapshots)
        yield GaugeMetricFamily("kiln_requests_running", "Requests being served", s.running)
        yield GaugeMetricFamily("kiln_requests_waiting", "Requests waiting to be admitted", s.waiting)
        yield CounterMetricFamily("kiln_engine_faults", "Engine rounds that failed on an internal error", s.faults)
        yield from self._collect_speculation()

    def _collect_speculation(self):
        sp = self.spec
        yield CounterMetricFamily("kiln_spec_steps", "Steps of requests that speculate (--spec)", sp.steps)
        yield CounterMetricFamily("kiln_spec_draft_tokens", "Tokens drafted by prompt lookup", sp.drafted)
        yield CounterMetricFamily("kiln_spec_accepted_tokens", "Drafted tokens the model confirmed", sp.accepted)
        yield CounterMetricFamily("kiln_spec_emitted_tokens", "Tokens the speculating requests' steps yielded",
                                  sp.emitted)
        yield GaugeMetricFamily("kiln_spec_acceptance_rate", "Accepted over drafted tokens, since the start",
                                sp.acceptance)
        yield GaugeMetricFamily("kiln_spec_tokens_per_step", "Tokens a speculating request's step yields, on average",
                                sp.tokens_per_step)

    def render(self) -> bytes:
        return generate_latest(self.registry)
