"""Next-token sampling over a logits row, in llama.cpp's order:
logit bias -> penalties -> constraint mask -> top-k -> top-p -> min-p -> temperature -> draw.
Temperature 0 is greedy.

OpenAI's logit_bias adds to chosen tokens' logits. A constraint (constraints.py) gives the tokens it
allows as a bool per vocabulary entry; the others become -inf in one vectorized pass over the row,
after the penalties (whose clipping would otherwise make them finite again). A row with neither
pays nothing.

The penalties look at the last repeat_last_n tokens of the history (prompt and output), as
llama.cpp's: repeat divides a seen token's positive logit (multiplies a negative one),
frequency subtracts per occurrence, presence once.

The sampler is total: for finite logits and parameters in range it returns a token, whatever
the extremes (a temperature of 1e-300, a penalty of 5e-324, a top_k past the vocabulary); every
parameter is checked when SamplingParams is made, naming it."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..core.errors import OptionError


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.8
    top_k: int = 40  # 0: off
    top_p: float = 0.95  # 1: off
    min_p: float = 0.05  # 0: off
    repeat_penalty: float = 1.0  # 1: off
    repeat_last_n: int = 64
    seed: int | None = None
    presence_penalty: float = 0.0  # 0: off
    frequency_penalty: float = 0.0  # 0: off

    def __post_init__(self) -> None:
        numbers = ("temperature", "top_k", "top_p", "min_p", "repeat_penalty", "repeat_last_n", "presence_penalty",
                   "frequency_penalty")
        for name in numbers:
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)) or not np.isfinite(v):
                raise OptionError(f"sampling option {name} must be a finite number, got {v!r}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, (int, np.integer))
                                      or not -1 <= self.seed < 2**64):
            raise OptionError(f"sampling option seed must be an integer in [0, 2^64), or -1 for a random one, "
                              f"got {self.seed!r}")
        checks = (("temperature", self.temperature >= 0), ("top_k", self.top_k >= 0),
                  ("top_p", 0 < self.top_p <= 1), ("min_p", 0 <= self.min_p <= 1),
                  ("repeat_penalty", self.repeat_penalty > 0), ("repeat_last_n", self.repeat_last_n >= 0),
                  ("presence_penalty", -2 <= self.presence_penalty <= 2),
                  ("frequency_penalty", -2 <= self.frequency_penalty <= 2))
        for name, ok in checks:
            if not ok:
                raise OptionError(f"sampling option {name} is out of range: {getattr(self, name)!r}")


DEFAULTS = SamplingParams()  # llama.cpp's defaults: the Python API, the CLI and the server start from these


_FINITE = 1e300  # logits are clipped to this after the penalties, so no difference of two is infinite
MAX_LOGIT_BIAS = 100.0  # OpenAI's range: -100 bans a token, +100 all but forces it


@dataclass(frozen=True, eq=False)
class LogitBias:
    """OpenAI's logit_bias: values added to some tokens' logits before sampling."""
    ids: np.ndarray  # int64
    values: np.ndarray  # float64, each in [-100, 100]

    @classmethod
    def of(cls, bias, n_vocab: int, field: str = "logit_bias") -> "LogitBias | None":
        """From {token id (int or its decimal text): bias}; None for an empty or missing one.
        OptionError naming the entry for an id out of range or a bias out of [-100, 100]."""
        if not bias:
            return None
        ids, values = [], []
        for key, value in bias.items():
            try:
                tid = int(key)
            except (TypeError, ValueError):
                raise OptionError(f"{field}: key {key!r} is not a token id") from None
            if not 0 <= tid < n_vocab:
                raise OptionError(f"{field}: token id {tid} is out of range [0, {n_vocab})")
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not np.isfinite(value) \
                    or not -MAX_LOGIT_BIAS <= value <= MAX_LOGIT_BIAS:
                raise OptionError(f"{field}: the bias of token {tid} must be a number in [-100, 100], got {value!r}")
            ids.append(tid)
            values.append(float(value))
        return cls(np.array(ids, np.int64), np.array(values, np.float64))


class Sampler:
    def __init__(self, params: SamplingParams):
        self.p = params
        self.rng = np.random.default_rng(None if params.seed == -1 else params.seed)

    def __call__(self, logits: np.ndarray, history: list[int], allowed: np.ndarray | None = None,
                 bias: LogitBias | None = None, distribution: bool = False) -> int:
        """A token for this row: `allowed` (a bool per token) is a constraint's mask, `bias` OpenAI's
        logit_bias. The row is not changed."""
        p = self.p
        x = logits.astype(np.float64)
        if bias is not None:
            np.add.at(x, bias.ids, bias.values)
        penalised = p.repeat_penalty != 1.0 or p.presence_penalty or p.frequency_penalty
        if penalised and history and p.repeat_last_n:
            seen, count = np.unique(np.asarray(history[-p.repeat_last_n:], dtype=np.int64), return_counts=True)
            with np.errstate(over="ignore", under="ignore"):
                x[seen] = np.where(x[seen] > 0, x[seen] / p.repeat_penalty, x[seen] * p.repeat_penalty)
            x[seen] -= count * p.frequency_penalty + p.presence_penalty
            np.clip(x, -_FINITE, _FINITE, out=x)
        if allowed is not None:
            np.copyto(x, -np.inf, where=~allowed)
        if p.temperature == 0:
            return _dense([int(np.argmax(x))], np.ones(1), len(x)) if distribution else int(np.argmax(x))
        order = self._best_first(x, p.top_k)
        probs = np.exp(x[order] - x[order[0]])
        probs /= probs.sum()
        if p.top_p < 1.0:
            keep = int(np.searchsorted(np.cumsum(probs), p.top_p)) + 1
            order, probs = order[:keep], probs[:keep]
        if p.min_p > 0:
            keep = probs >= p.min_p * probs[0]
            order, probs = order[keep], probs[keep]
        with np.errstate(over="ignore", under="ignore"):  # a tiny temperature sends all but the best to -inf
            w = np.exp((x[order] - x[order[0]]) / p.temperature)
        if distribution:
            return _dense(order, w / w.sum(), len(x))
        return int(order[self.rng.choice(len(order), p=w / w.sum())])

    def distribution(self, logits: np.ndarray, history: list[int], allowed: np.ndarray | None = None,
                     bias: LogitBias | None = None) -> np.ndarray:
        """What __call__ would draw from, as a probability per token [vocab] (a point mass when
        greedy); nothing is drawn. Speculative sampling's acceptance rule needs it
        (speculation.py)."""
        return self(logits, history, allowed, bias, distribution=True)

    @staticmethod
    def _best_first(x: np.ndarray, top_k: int) -> np.ndarray:
        """Token ids by logit, best first (ties by id): the top_k of them (0: all) found by a
        partial selection, so that only those are sorted."""
        if 0 < top_k < len(x):
            part = np.argpartition(-x, top_k - 1)[:top_k]
            kth = x[part].min()
            part = np.flatnonzero(x >= kth)  # every token tied with the k-th, so ties break by id as a full sort does
            order = part[np.lexsort((part, -x[part]))]
            return order[:top_k]
        return np.argsort(-x, kind="stable")


def _dense(ids, probs: np.ndarray, n_vocab: int) -> np.ndarray:
    out = np.zeros(n_vocab, np.float64)
    out[ids] = probs
    return out
