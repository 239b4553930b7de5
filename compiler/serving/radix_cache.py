"""A prefix cache over the paged KV pool: a radix tree over token ids whose edges are whole pages.

Each node holds a reference to the pages of its edge (taken with Sequence.share), so a
prefix outlives the request that computed it. A new request walks the tree along its prompt,
opens its sequence on the longest usable prefix (Model.sequence(pages=...)), and prefills only
the rest. Because kiln's logits are bitwise batch-invariant, a hit gives exactly the output of
a cold run.

Reference counts live in C, so evicting a node never takes a page from a running sequence: it
drops the tree's reference, and the page returns to the pool once no sequence holds it either.
Requests still lock the nodes they use, so that eviction prefers prefixes nobody is reading.
Eviction takes unlocked leaves, least recently used first (SGLang's radix cache).

Sliding-window layers drop pages that left every window; a node keeps -1 for those. A prefix
of k pages is usable only if every group still has the pages a query at position k reads (the
rule vLLM and SGLang use for sliding-window models).
"""
from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field

import numpy as np

from ..runtime import Model, Sequence


@dataclass(eq=False)
class Node:
    key: tuple[int, ...]  # the edge's token ids: whole pages
    pages: np.ndarray  # [len(key) / page_size, n_groups] page ids, -1 where a sliding group let go
    parent: "Node | None"
    children: dict[tuple[int, ...], "Node"] = field(default_factory=dict)  # by the first page's ids
    lock: int = 0  # requests using this node (or a descendant)
    last_used: int = 0


@dataclass
class Match:
    """A usable cached prefix: its tokens and pages, and the deepest node of its path, which a
    request locks (with every node above it) while it uses the prefix."""
    tokens: list[int]
    pages: np.ndarray  # [n_blocks, n_groups]
    node: Node | None


class RadixCache:
    def __init__(self, model: Model):
        self.model, self.ps = model, model.page_size
        self.root = Node((), np.empty((0, model.n_groups), np.int32), None)
        self.clock = itertools.count(1)
        self.pages_held = 0  # pages the tree holds a reference to, over every layer group
        self.evicted_pages = 0

    # -- lookups ----------------------------------------------------------------------------
    def _walk(self, ids: list[int], limit_blocks: int) -> tuple[list[Node], int]:
        """The nodes along ids' longest cached prefix of at most limit_blocks pages, the last
        split so that the prefix ends where it does; and the prefix's length in pages."""
        node, path, n = self.root, [], 0
        while n < limit_blocks:
            child = node.children.get(tuple(ids[n * self.ps:(n + 1) * self.ps]))
            if child is None:
                break
            same = 0
            for b in range(min(len(child.pages), limit_blocks - n)):
                if child.key[b * self.ps:(b + 1) * self.ps] != tuple(ids[(n + b) * self.ps:(n + b + 1) * self.ps]):
                    break
                same += 1
            partial = same < len(child.pages)
            node = self._split(child, same) if partial else child
            path.append(node)
            n += same
            if partial:
                break
        return path, n

    def _split(self, node: Node, blocks: int) -> Node:
        """Cut node's edge after `blocks` pages; the new upper node takes its place."""
        upper = Node(node.key[:blocks * self.ps], node.pages[:blocks], node.parent, lock=node.lock,
                     last_used=node.last_used)
        upper.parent.children[upper.key[:self.ps]] = upper
        node.key, node.pages, node.parent = node.key[blocks * self.ps:], node.pages[blocks:], upper
        upper.children[node.key[:self.ps]] = node
        return upper

    def _usable(self, pages: np.ndarray) -> int:
        """The most pages k of this prefix that a query at position k * page_size can use: every
        sliding group still holds the pages its window reads."""
        for k in range(len(pages), 0, -1):
            if all(np.all(pages[max(0, k * self.ps - w + 1) // self.ps:k, g] >= 0) if w else np.all(pages[:k, g] >= 0)
                   for g, w in enumerate(self.model.windows)):
                return k
        return 0

    def match(self, ids: list[int]) -> Match:
        """The longest usable cached prefix of ids that leaves at least one token to run (its
        logits start the generation), locked for the caller; unlock it with release()."""
        path, n = self._walk(ids, (len(ids) - 1) // self.ps)
        pages = np.concatenate([self.root.pages] + [nd.pages for nd in path])
        k = self._usable(pages)
        while path and sum(len(nd.pages) for nd in path) > k:  # cut the path back to k pages
            over = sum(len(nd.pages) for nd in path) - k
            last = path.pop()
            if over < len(last.pages):
                path.append(self._split(last, len(last.pages) - over))
        held = Match(list(ids[:k * self.ps]), pages[:k], path[-1] if path else None)
        self._lock(held.node, +1)
        return held

    # -- updates ----------------------------------------------------------------------------
    def insert(self, seq: Sequence, held: Match | None) -> Match:
        """Cache seq's full pages (what seq.tokens holds). Returns the new match to hold, the
        old one (if any) released: the caller now locks the whole inserted path."""
        ids = seq.tokens
        n_blocks = min(len(ids), seq.n_past) // self.ps
        path, n = self._walk(ids, n_blocks)
        if n < n_blocks:
            parent = path[-1] if path else self.root
            node = Node(tuple(ids[n * self.ps:n_blocks * self.ps]), seq.share(n, n_blocks - n), parent)
            parent.children[node.key[:self.ps]] = node
            self.pages_held += int((node.pages >= 0).sum())
            path.append(node)
        inserted = Match(list(ids[:n_blocks * self.ps]),
                         np.concatenate([self.root.pages] + [nd.pages for nd in path]), path[-1] if path else None)
        self._lock(inserted.node, +1)
        self.release(held)
        return inserted

    def release(self, held: Match | None) -> None:
        if held is None:
            return
        self._lock(held.node, -1)
        held.node = None

    def _lock(self, node: Node | None, delta: int) -> None:
        now = next(self.clock)
        while node is not None and node is not self.root:
            node.lock += delta
            node.last_used = now
            node = node.parent

    def evict(self, n_blocks: int, locked_too: bool = False) -> int:
        """Drop least recently used leaves until n_blocks blocks' references have been given
        back; unlocked ones only, unless locked_too. Returns the blocks given back."""
        leaves = [(nd.last_used, id(nd), nd) for nd in self._nodes() if not nd.children and (locked_too or not nd.lock)]
        heapq.heapify(leaves)
        done = 0
        while leaves and done < n_blocks:
            _, _, node = heapq.heappop(leaves)
            self.model.release_pages(node.pages)
            done += len(node.pages)
            self.pages_held -= int((node.pages >= 0).sum())
            self.evicted_pages += int((node.pages >= 0).sum())
            parent = node.parent
            del parent.children[node.key[:self.ps]]
            if parent is not self.root and not parent.children and (locked_too or not parent.lock):
                heapq.heappush(leaves, (parent.last_used, id(parent), parent))
        return done

    def clear(self) -> None:
        self.evict(1 << 62, locked_too=True)

    def _nodes(self):
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())
