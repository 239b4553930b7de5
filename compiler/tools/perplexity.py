"""Perplexity of a text, two ways.

chunks: llama-perplexity's method. The text is cut into chunks of ctx tokens, each read by a
        fresh sequence (its first token replaced by BOS where the model adds one), and only the
        second half of each chunk is scored: every scored token has at least ctx/2 of context.
stream: the whole text through one sequence of ctx positions, as a long conversation would
        go: when the cache is full it is shifted (the first `sinks` positions kept, half of
        the rest dropped), so every token after the first is scored. With sinks this is
        StreamingLLM; with none, a plain sliding window. With the h2o policy the same number
        of positions is kept, but half of them (after the sinks) are the heavy hitters, the
        positions that have received the most attention, and half the most recent (H2O).

The scoring is plain numpy over the logits, so the same functions score llama.cpp's logits
(tests/test_perplexity.py) and kiln's.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence as SequenceABC
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..core.errors import OptionError
from ..core.numerics import log_softmax

DEFAULT_TEXT = Path(__file__).parent / "data" / "scandal_in_bohemia.txt"
DEFAULT_TEXT_SOURCE = ("A Scandal in Bohemia, from The Adventures of Sherlock Holmes by Arthur Conan Doyle "
                       "(1891; Project Gutenberg eBook #1661, public domain)")
MODES = ("chunks", "stream")
POLICIES = ("window", "h2o")


@dataclass(frozen=True)
class Perplexity:
    mode: str
    ctx: int
    sinks: int | None  # stream mode: positions a shift keeps; None in chunks mode
    kv_dtype_k: str
    kv_dtype_v: str
    n_scored: int
    nll: float  # mean negative log-likelihood per scored token, nats
    n_shifts: int = 0
    policy: str = "window"  # stream mode: what a full cache keeps

    @property
    def ppl(self) -> float:
        return math.exp(self.nll)

    def as_json(self) -> dict:
        return {"mode": self.mode, "ctx": self.ctx, "sinks": self.sinks, "kv_dtype_k": self.kv_dtype_k,
                "kv_dtype_v": self.kv_dtype_v, "n_scored": self.n_scored, "ppl": self.ppl, "nll": self.nll,
                "n_shifts": self.n_shifts, "policy": self.policy}


def token_nll(logits: np.ndarray, targets: SequenceABC[int]) -> np.ndarray:
    """-log softmax(logits[i])[targets[i]] for each row, in float64."""
    lp = log_softmax(logits)
    return -lp[np.arange(len(lp)), np.asarray(targets)]


def chunk_inputs(ids: list[int], ctx: int, bos: int | None) -> list[list[int]]:
    """llama-perplexity's chunks: whole chunks of ctx tokens, the first one BOS where the model adds it."""
    if ctx < 4:
        raise OptionError(f"ctx (--ctx) must be at least 4 for chunked perplexity, got {ctx}")
    n = len(ids) // ctx
    if n < 1:
        raise OptionError(f"the text has {len(ids)} tokens, fewer than one chunk of ctx={ctx} (--ctx)")
    chunks = [list(ids[i * ctx:(i + 1) * ctx]) for i in range(n)]
    if bos is not None:
        for c in chunks:
            c[0] = bos
    return chunks


def score_chunk(logits: np.ndarray, tokens: list[int]) -> np.ndarray:
    """The second half of a chunk: logits[j] predicting tokens[j + 1] for ctx/2 <= j < ctx - 1."""
    first = len(tokens) // 2
    return token_nll(logits[first:len(tokens) - 1], tokens[first + 1:])


def chunks(all_logits: Callable[[list[int]], np.ndarray], ids: list[int], ctx: int, bos: int | None) -> np.ndarray:
    """Per-token NLL over llama-perplexity's chunks; all_logits(tokens) reads tokens from a fresh context."""
    return np.concatenate([score_chunk(all_logits(c), c) for c in chunk_inputs(ids, ctx, bos)])


def h2o_keep(mass: np.ndarray, sinks: int, n_keep: int) -> np.ndarray:
    """H2O's choice of n_keep positions: the sinks, then half of the rest the most recent, half
    the heavy hitters among the others (the largest accumulated attention), in order."""
    n = mass.size
    recent = (n_keep - sinks) // 2
    heavy = n_keep - sinks - recent
    middle = np.arange(sinks, n - recent)
    hitters = middle[np.argsort(-mass[sinks:n - recent], kind="stable")[:heavy]]
    return np.sort(np.concatenate([np.arange(sinks), hitters, np.arange(n - recent, n)]))


def stream(seq, ids: list[int], sinks: int, batch: int = 32, n_discard: int | None = None,
           policy: str = "window") -> tuple[np.ndarray, int]:
    """Per-token NLL of ids[1:] read through `seq` (a kiln Sequence), evicting by `policy` when it
    is full; also the number of evictions. `batch` tokens are read per step."""
    ctx = seq.model.n_ctx
    if not 0 <= sinks <= ctx // 2 - batch:
        raise OptionError(f"sinks (--sinks) must be between 0 and ctx / 2 - batch = {ctx // 2 - batch}, got {sinks}")
    out, shifts = [], 0
    prev = seq.prefill(ids[:1])
    for at in range(1, len(ids), batch):
        part = ids[at:at + batch]
        if seq.n_past + len(part) > ctx:
            drop = max(n_discard or (seq.n_past - sinks) // 2, seq.n_past + len(part) - ctx)
            if policy == "h2o":
                seq.keep(h2o_keep(seq.attention_mass(), sinks, seq.n_past - drop))
            else:
                seq.shift(sinks, drop)
            shifts += 1
        logits = seq.prefill(part, logits="all")
        out.append(token_nll(np.vstack([prev[None], logits[:-1]]), part))
        prev = logits[-1]
    return np.concatenate(out), shifts


def measure(model, text: str, mode: str, sinks: int = 4, batch: int = 32, n_discard: int | None = None,
            policy: str = "window") -> Perplexity:
    """`model` is a loaded kiln Model whose n_ctx is the context to measure at."""
    if mode not in MODES:
        raise OptionError(f"mode (--mode) must be one of {', '.join(MODES)}, got {mode!r}")
    if policy not in POLICIES:
        raise OptionError(f"policy (--policy) must be one of {', '.join(POLICIES)}, got {policy!r}")
    if policy == "h2o" and any(model.windows):
        raise OptionError(f"policy (--policy) h2o keeps positions by attention in every layer, but "
                          f"{model.spec.path.name} has sliding-window layers, which keep only their window")
    ids = model.tokenize(text)
    kv = model.compiled.planned.layout.kv
    k, v = kv.config.k_dtype.label, kv.config.v_dtype.label
    if mode == "chunks":
        tok = model.spec.tokenizer
        bos = tok.bos_id if tok.add_bos else None

        def fresh(tokens: list[int]) -> np.ndarray:
            model.reset()
            return model.prefill(tokens, logits="all")

        nll = chunks(fresh, ids, model.n_ctx, bos)
        return Perplexity(mode, model.n_ctx, None, k, v, nll.size, float(nll.mean()))
    model.reset()
    keep = model.sinks(ids, sinks) if sinks else 0
    model.track_attention(policy == "h2o")
    try:
        nll, shifts = stream(model.default_sequence, ids, keep, batch, n_discard, policy)
    finally:
        model.track_attention(False)
    return Perplexity(mode, model.n_ctx, keep, k, v, nll.size, float(nll.mean()), shifts, policy)


def render(results: list[Perplexity], model: str, source: str) -> str:
    out = [f"perplexity: {model}, {source}",
           f"{'mode':<7} {'policy':<6} {'ctx':>6} {'sinks':>5} {'K':<5} {'V':<5} {'scored':>7} {'shifts':>6} {'ppl':>9}"]
    for r in results:
        sinks = "-" if r.sinks is None else str(r.sinks)
        out.append(f"{r.mode:<7} {r.policy if r.mode == 'stream' else '-':<6} {r.ctx:>6} {sinks:>5} {r.kv_dtype_k:<5} {r.kv_dtype_v:<5} {r.n_scored:>7} "
                   f"{r.n_shifts:>6} {r.ppl:>9.4f}")
    return "\n".join(out) + "\n"
