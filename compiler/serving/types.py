"""What the server, the engine and the metrics pass between them: a request and what it hears
back, and a snapshot of the engine's state. The protocol and the metrics know these types, not
the engine."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..core.errors import KilnError
from ..core.numerics import log_softmax
from ..runtime import Sequence
from ..runtime.constraints import Guide
from ..runtime.generation import Decoding, ThinkingBudget
from ..runtime.sampling import LogitBias, SamplingParams
from .radix_cache import Match


class QueueFull(KilnError):
    """The waiting queue is at its limit; try again later."""


@dataclass(frozen=True)
class TokenLogprob:
    token: int
    logprob: float
    top: tuple[tuple[int, float], ...]  # the most likely tokens and their logprobs, best first

    @classmethod
    def of(cls, logits: np.ndarray, token: int, n_top: int) -> "TokenLogprob":
        lp = log_softmax(logits)
        top = np.argsort(-lp, kind="stable")[:n_top] if n_top else []
        return cls(token, float(lp[token]), tuple((int(t), float(lp[t])) for t in top))


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int | None  # None: not told (with several API keys it would tell one tenant of another's prompts)

    def hidden_cache(self) -> "Usage":
        return Usage(self.prompt_tokens, self.completion_tokens, None)


@dataclass(frozen=True)
class Event:
    """What a request hears from the engine: a token (its text may be empty while a stop string
    could still match), then one event with finish_reason (stop or length) or error set."""
    text: str = ""
    token: int | None = None
    logprob: TokenLogprob | None = None
    finish_reason: str | None = None
    usage: Usage | None = None
    error: str | None = None
    invalid: bool = False  # the error is the request's own (its constraint reached a dead end): a 400


@dataclass(frozen=True)
class EngineStats:
    """The engine at one moment, for /metrics."""
    pages_total: int
    pages_used: int
    utilization: float
    prefix_cache_pages: int
    evicted_pages: int  # by the prefix cache, since the engine started
    running: int
    waiting: int
    faults: int  # engine rounds that failed on a bug (their running requests failed with them)
    snapshot_bytes: int = 0  # a hybrid's state snapshots (state_cache.py), held now
    snapshots: int = 0


@dataclass(eq=False)
class Request:
    prompt_ids: list[int]
    params: SamplingParams
    max_tokens: int
    stops: list[str]
    emit: Callable[[Event], None]
    logprobs: int | None = None  # None: off; n: the sampled token's logprob and the n most likely
    ignore_eos: bool = False
    id_slot: int | None = None  # llama-server's: start from this slot's own (restored) cache, if it matches
    guide: Guide | None = None  # its constraint (runtime/constraints.py), compiled before it is submitted
    bias: LogitBias | None = None  # OpenAI's logit_bias
    thinking: ThinkingBudget | None = None  # its reasoning budget
    special: bool = False  # its output's control tokens come out as text (harmony's channels)
    # the engine's state
    private: bool = False  # it read a slot's own cache: its pages never enter the shared prefix cache
    output: list[int] = field(default_factory=list)
    seq: Sequence | None = None
    held: Match | None = None
    todo: list[int] = field(default_factory=list)  # tokens to run before the next sample
    cached_tokens: int | None = None  # of the first admission
    done: bool = False
    arrival: float = field(default_factory=time.monotonic)
    last_token_at: float | None = None
    order: int = 0  # admission order; the newest is preempted first
    resume: list[int] | None = None  # after a preemption of a shifted sequence: the tokens it held
    decoding: Decoding | None = None  # the sampler, the penalties' history, the text and the stop rules
    pending: np.ndarray | None = None  # logits whose sampling waits for the constraint's mask (scheduler.py)
    speculative: bool = True  # under kiln serve --spec: it drafts (the request's "speculative": false opts out)
    spec: object | None = None  # its drafter's state, a speculating.Drafting
