"""Prefix-affinity routing for kiln's replicas on Ray Serve: a request goes to the replica whose
radix cache most likely holds the longest page-aligned prefix of its prompt, unless that replica
is full or busier than the least-loaded one by more than a bound; then to the least loaded.

A prompt is named by a chain of hashes, one per whole KV page of its tokens: the hash of block i
covers blocks 0..i, so two prompts share hash i exactly when they share their first i + 1 pages,
which is what a replica's radix cache can reuse (it holds whole pages only). The router keeps the
replicas it sent each hash to; a new request's longest hash that live replicas were sent names
those to prefer, the least loaded of them first. A prefix none was sent goes to the replica that
was sent the fewest (Ray's "smallest tenant"), so that the prefixes spread over the caches.

This is SGLang's cache-aware router and Ray's PrefixCacheAffinityRouter in spirit, on token pages
rather than characters, with the table in the router itself (each ingress replica learns its own;
it never waits on another actor). The table cannot see a replica's evictions: an entry is a
likelihood, and the cost of a wrong guess is one prefill, never a wrong answer.
"""
from __future__ import annotations

import random
from collections import Counter, OrderedDict
from dataclasses import dataclass

from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica

MAX_BLOCKS = 64  # pages of a prompt hashed at most: past 64 pages a longer match changes little
TABLE_BLOCKS = 1 << 16  # hashes the router remembers, least recently sent dropped first


def prefix_blocks(ids: list[int], page_size: int, max_blocks: int = MAX_BLOCKS) -> tuple[int, ...]:
    """The chain of hashes of a prompt's whole pages (a partial last page is not cacheable)."""
    out, h = [], 0
    for i in range(min(len(ids) // page_size, max_blocks)):
        h = hash((h, tuple(ids[i * page_size:(i + 1) * page_size])))
        out.append(h)
    return tuple(out)


@dataclass(frozen=True)
class Routed:
    """What the ingress sends a replica: the HTTP request (ASGI scope less what cannot travel, and
    the whole body) and what the router reads: the prompt's page hashes, and a replica to avoid
    (the one a retried request was on when it died)."""
    scope: dict
    body: bytes
    blocks: tuple[int, ...] = ()
    avoid: str | None = None


class PrefixAffinityRouter(RequestRouter):
    """Ray Serve's request-router API (ray.serve.request_router). Requests are routed out of order,
    each by the task that chose for it, so a replica picked for one prefix is never handed to
    another request (FIFOMixin would)."""

    def initialize_state(self, imbalance: int = 1 << 30, table_blocks: int = TABLE_BLOCKS):
        """imbalance: how many more requests the preferred replica may have than the least-loaded
        one before the request goes to the least-loaded one instead. A full replica (at its
        max_ongoing_requests) is never preferred, whatever the bound. kiln's default lets only
        that move a prefix: on a CPU a prefill is dear, and measured on the multi-tenant
        workload (docs/cluster.md), spreading at a bound of n_seq lost more to
        prefills than it won back in queueing."""
        self._imbalance = imbalance
        self._table_blocks = table_blocks
        self._sent: OrderedDict[int, set[ReplicaID]] = OrderedDict()  # hash -> replicas sent it
        self._held: Counter[ReplicaID] = Counter()  # hashes each replica was sent

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None) -> list[list[RunningReplica]]:
        routed = _routed(pending_request)
        candidates = [r for r in candidate_replicas if routed is None or r.replica_id.unique_id != routed.avoid]
        loads = await self._loads(candidates or candidate_replicas)
        if not loads:
            return []  # none answered or all are full: Ray backs off and asks again
        blocks = routed.blocks if routed is not None else ()
        holders = self._holders(blocks, loads)
        chosen = min(holders, key=loads.__getitem__) if holders else None
        if chosen is None and blocks:
            # a prefix no replica with room was sent: to the one holding the fewest (as Ray's does)
            chosen = self._pick(loads, lambda r: (self._held[r.replica_id], loads[r]))
        elif chosen is None or loads[chosen] - min(loads.values()) > self._imbalance:
            chosen = self._pick(loads, lambda r: (loads[r], self._held[r.replica_id]))  # the least loaded
        self._remember(routed, chosen.replica_id)
        return [[chosen]]

    @staticmethod
    def _pick(loads: dict[RunningReplica, int], rank) -> RunningReplica:
        """The replica that ranks first (lowest), a tie broken at random."""
        best = min(rank(r) for r in loads)
        return random.choice([r for r in loads if rank(r) == best])

    def _holders(self, blocks: tuple[int, ...], loads: dict[RunningReplica, int]) -> list[RunningReplica]:
        """The replicas with room that were sent the longest of these prefixes."""
        by_id = {r.replica_id: r for r in loads}
        for h in reversed(blocks):
            found = [by_id[i] for i in self._sent.get(h, ()) if i in by_id]
            if found:
                return found
        return []

    def _remember(self, routed: Routed | None, replica_id: ReplicaID) -> None:
        """The prefixes are on this replica now too (noted here, as Ray calls on_request_routed
        only under its strict max_ongoing_requests). A hot prefix so comes to live on several
        replicas, and its requests go to whichever of them is least loaded."""
        for h in routed.blocks if routed is not None else ():
            sent = self._sent.setdefault(h, set())
            if replica_id not in sent:
                sent.add(replica_id)
                self._held[replica_id] += 1
            self._sent.move_to_end(h)
        while len(self._sent) > self._table_blocks:
            for i in self._sent.popitem(last=False)[1]:
                self._held[i] -= 1

    async def _loads(self, replicas: list[RunningReplica]) -> dict[RunningReplica, int]:
        """Requests each replica is serving, from the router's cache or asked for; only replicas
        that answered and have room."""
        loads = {r: self.replica_queue_len_cache.get(r.replica_id) for r in replicas}
        unknown = [r for r, q in loads.items() if q is None]
        if unknown:  # asked as Ray's own routers ask (its PrefixCacheAffinityRouter too)
            loads.update((r, q) for r, q in await self._probe_queue_lens(unknown, 0) if q is not None)
        return {r: q for r, q in loads.items() if q is not None and q < r.max_ongoing_requests}


def _routed(pending_request: PendingRequest | None) -> Routed | None:
    """The request's Routed, by its shape: Ray may have unpickled this module's classes anew."""
    args = pending_request.args if pending_request is not None else None
    return args[0] if args and hasattr(args[0], "blocks") and hasattr(args[0], "avoid") else None
