"""Constrained decoding: JSON schema, regex, llama.cpp's GBNF and Lark grammars enforced token by
token by llguidance (the engine llama.cpp and vLLM use).

A Constraint is what a caller asks for. Compiling it (Guidance.guide) checks it at once: a schema
or grammar llguidance rejects raises ConstraintError naming the field it came from and, for a JSON
schema, the path inside it that is at fault. A Guide is one sequence's matcher. After each sampled
token a worker thread advances the matcher and computes the next token mask: while the caller runs
the next step where the step leaves a core free (llguidance releases the GIL, and so does the
step's C call), else right after the step, when its threads have let go of every core
(`Guidance.overlap`: a worker that takes a core from a step's spinning threads stalls the whole
step; once, on the loaded 2-core development machine with a 2-thread step, a JSON answer cost 45%
more a token with masks during the step, 3-13% with masks after it). The mask is a bit
per vocabulary entry; sampling.py applies it to the row in one numpy pass. A sequence without a
constraint has no Guide and pays nothing.

A lazy constraint (`trigger`) leaves the output free until the trigger text appears in it, then
constrains what follows (a tool call that begins with `<tool_call>`).

Bounds, for a server that takes schemas from strangers: the source text is held to
MAX_SOURCE_BYTES, and llguidance's own limits (LIMITS: grammar size, lexer states, the fuel a mask
may burn, the parser's items a step) bound what compiling and every mask may cost; past them the
matcher fails, which fails its request alone (DeadEnd), as does a sequence whose masks have taken
MASK_BUDGET seconds in all.
"""
from __future__ import annotations

import json
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable

import llguidance
import numpy as np

from ..core.errors import KilnError, OptionError
from ..text.grammar_vocab import GrammarVocab, grammar_vocab
from .schema_path import deepest

KINDS = ("json_schema", "regex", "grammar", "lark")  # grammar: llama.cpp's GBNF (a Lark grammar is taken too)
MAX_SOURCE_BYTES = 128 << 10
# JSON as a program writes it: ", " and ": ", no free whitespace (where a small model could run on
# with newlines); a schema's own "x-guidance" may say otherwise.
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
LIMITS = {"max_grammar_size": 200_000, "max_lexer_states": 50_000, "initial_lexer_fuel": 1_000_000,
          "step_lexer_fuel": 200_000, "step_max_items": 50_000, "verbose_errors": False}
MASK_WORKERS = 2
MASK_TIMEOUT = 10.0  # seconds one token's mask may take before a server ends its request
MASK_BUDGET = 60.0  # seconds of worker time one sequence's masks may take in all
LOCATE_BUDGET = 64  # sub-schemas tried when looking for the part of a schema llguidance rejects


class ConstraintError(KilnError):
    """A schema or grammar llguidance rejects (the message names the field, and the schema path)."""


class DeadEnd(ConstraintError):
    """While generating, the constraint allowed no token (one of llguidance's limits was reached,
    or nothing could continue the output)."""


@dataclass(frozen=True)
class Constraint:
    kind: str  # one of KINDS
    source: str  # the schema as JSON text, or the grammar or regex
    field: str = ""  # where it came from, for messages ("json_schema", "response_format.json_schema.schema")
    trigger: str | None = None  # lazy: the output is free until this text appears in it

    def __post_init__(self):
        if self.kind not in KINDS:
            raise OptionError(f"constraint kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if not isinstance(self.source, str):
            raise ConstraintError(f"{self.name}: must be text, got {type(self.source).__name__}")
        if len(self.source.encode("utf-8", errors="replace")) > MAX_SOURCE_BYTES:
            raise ConstraintError(f"{self.name}: {len(self.source):,} characters; at most {MAX_SOURCE_BYTES:,} bytes")

    @property
    def name(self) -> str:
        return self.field or self.kind

    @classmethod
    def json_schema(cls, schema: dict | bool | str, field: str = "json_schema",
                    trigger: str | None = None) -> "Constraint":
        """A JSON schema (a dict, or its JSON text)."""
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except ValueError as e:
                raise ConstraintError(f"{field}: not valid JSON: {e}") from None
        if not isinstance(schema, (dict, bool)):
            raise ConstraintError(f"{field}: a JSON schema is an object (or true/false), got {type(schema).__name__}")
        return cls("json_schema", json.dumps(schema), field, trigger)

    @classmethod
    def json_object(cls, field: str = "response_format") -> "Constraint":
        """Any JSON object (OpenAI's json_object mode)."""
        return cls.json_schema({"type": "object"}, field)

    def grammar(self) -> str:
        """llguidance's grammar for this constraint; ConstraintError where it cannot be made."""
        try:
            if self.kind == "json_schema":
                return llguidance.LLMatcher.grammar_from_json_schema(self.source, defaults=JSON_OPTIONS)
            return llguidance.grammar_from("gbnf" if self.kind == "grammar" else self.kind, self.source)
        except BaseException as e:
            if not _llguidance_failed(e):
                raise
            raise ConstraintError(f"{self.name}: {e}") from None


def constraint_of(json_schema=None, regex: str | None = None, grammar: str | None = None,
                  lark: str | None = None) -> Constraint | None:
    """The Python API's keywords: at most one of them, as a Constraint (None for none)."""
    given = {k: v for k, v in (("json_schema", json_schema), ("regex", regex), ("grammar", grammar),
                               ("lark", lark)) if v is not None}
    if len(given) > 1:
        raise OptionError(f"give at most one of json_schema, regex, grammar and lark, got {', '.join(given)}")
    if not given:
        return None
    (kind, source), = given.items()
    return Constraint.json_schema(source) if kind == "json_schema" else Constraint(kind, source, kind)


def _limits() -> llguidance.LLParserLimits:
    return llguidance.LLParserLimits(**LIMITS)


def _llguidance_failed(e: BaseException) -> bool:
    """An error of llguidance's own: an exception, or a Rust panic (pyo3's PanicException is a
    BaseException, which would pass through a server's `except Exception`)."""
    return isinstance(e, Exception) or type(e).__name__ == "PanicException"


def schema_path(schema: dict) -> str:
    """The JSON pointer of the deepest sub-schema llguidance rejects on its own (with the root's
    $defs beside it, for its references); "" when only the whole schema fails."""
    defs = {k: schema[k] for k in ("$defs", "definitions") if k in schema}

    def rejected(sub: dict) -> bool:
        try:
            grammar = llguidance.LLMatcher.grammar_from_json_schema({**defs, **sub}, defaults=JSON_OPTIONS)
            return llguidance.LLMatcher.validate_grammar(grammar, None, limits=_limits()) != ""
        except BaseException as e:
            if not _llguidance_failed(e):
                raise
            return True

    return deepest(schema, rejected, LOCATE_BUDGET)


# -- one sequence's matcher ----------------------------------------------------------------------
@dataclass(frozen=True)
class _Mask:
    allowed: np.ndarray | None  # bool per vocabulary entry; None: the matcher failed
    stopped: bool  # the grammar is complete: nothing but the end may follow
    error: str
    seconds: float  # the worker's time for the token: advancing the matcher and computing this mask


def _reason(error: str) -> str:
    """llguidance's error, readable: its stop reasons named, its placeholder for detail dropped."""
    error = error.replace("<non-verbose/>", "").strip()
    if error in ("NoExtension", "NoExtensionBias"):
        return f"the grammar allows nothing here ({error}); it may have no complete output"
    return error


class Guide:
    """One sequence's constraint. `mask()` gives the tokens allowed next (computed on a worker thread
    since the last `advance`), `advance(token)` hands the sampled token over. Used from one thread at
    a time; the matcher itself is touched only by the worker job in flight."""

    def __init__(self, vocab: GrammarVocab, matcher: llguidance.LLMatcher, workers: ThreadPoolExecutor,
                 constraint: Constraint, overlap: bool = False):
        self.vocab, self.constraint, self.overlap = vocab, constraint, overlap
        self._matcher, self._workers = matcher, workers
        self._trigger = constraint.trigger.encode() if constraint.trigger else None
        self.active = self._trigger is None  # a lazy guide waits for its trigger
        self._seen = b""  # the output's last bytes, while waiting for the trigger
        self._future: Future | None = None
        self._queued: list[int] | None = None  # tokens whose work is not yet handed to a worker
        self._last: _Mask | None = None
        self.tokens, self.seconds, self.submitted = 0, 0.0, time.monotonic()
        self._untold: float | None = None  # the last mask's seconds, until take_seconds
        if self.active:
            self._submit([])

    def _submit(self, tokens: list[int]) -> None:
        self._queued = tokens
        if self.overlap:
            self.start()

    def start(self) -> None:
        """Hand the queued work (advance the matcher, compute the next mask) to a worker: at once in
        advance() where the step leaves a core free; else the caller's next call, or the server's
        scheduler right after the step."""
        if self._queued is not None:
            self.submitted = time.monotonic()
            self._future, self._queued = self._workers.submit(self._work, self._queued), None

    def _work(self, tokens: list[int]) -> _Mask:
        """On a worker thread: advance the matcher by `tokens`, then compute the next mask. Whatever
        llguidance raises becomes this sequence's dead end, never the caller's crash."""
        start = time.perf_counter()
        try:
            return self._advance(tokens, start)
        except BaseException as e:
            if not _llguidance_failed(e):
                raise
            return _Mask(None, False, f"llguidance failed: {e}", time.perf_counter() - start)

    def _advance(self, tokens: list[int], start: float) -> _Mask:
        m, v = self._matcher, self.vocab
        if tokens and not m.consume_tokens(tokens) or m.is_error():
            return _Mask(None, False, m.get_error() or "the token was not allowed", time.perf_counter() - start)
        mask = m.compute_bitmask()
        if m.is_error():
            return _Mask(None, False, m.get_error(), time.perf_counter() - start)
        allowed = np.unpackbits(np.frombuffer(mask, np.uint8), count=v.n_vocab, bitorder="little").view(bool)
        if allowed[v.eos]:
            allowed[list(v.eog_ids)] = True  # llguidance knows one end token; the model has several
        if not allowed.any():
            return _Mask(None, False, "no token can continue the output", time.perf_counter() - start)
        return _Mask(allowed, m.is_stopped(), "", time.perf_counter() - start)

    def ready(self) -> bool:
        """Whether mask() would return without waiting."""
        self.start()
        return self._future is None or self._future.done()

    def waiting(self) -> Future | None:
        self.start()
        return self._future

    def waited(self) -> float:
        """Seconds since the worker was given the current mask."""
        return time.monotonic() - self.submitted

    def take_seconds(self) -> float | None:
        """The worker's seconds for the mask last used, once (None if already told, or none was used)."""
        seconds, self._untold = self._untold, None
        return seconds

    def mask(self) -> np.ndarray | None:
        """The tokens allowed next, waiting for the worker if it is not done; None while a lazy
        guide waits for its trigger. DeadEnd when the matcher failed."""
        if not self.active:
            return None
        self.start()
        if self._future is not None:
            got, self._future = self._future.result(), None
            self._last = got
            self.tokens += 1
            self.seconds += got.seconds
            self._untold = got.seconds
            if got.allowed is None:
                raise DeadEnd(f"{self.constraint.name}: the constraint allows no next token after "
                              f"{self.tokens - 1} tokens: {_reason(got.error)}")
            if self.seconds > MASK_BUDGET:
                raise DeadEnd(f"{self.constraint.name}: the constraint's masks have taken {self.seconds:.1f} s "
                              f"over {self.tokens} tokens, past the limit of {MASK_BUDGET:g} s")
        return self._last.allowed

    @property
    def stopped(self) -> bool:
        """After mask(): the grammar is complete and only the end of generation may follow."""
        return self.active and self._last is not None and self._last.stopped

    def advance(self, token: int, piece: bytes) -> None:
        """The sampled token (whose text is `piece`): the worker starts on the next mask."""
        if self.active:
            self._submit([token])
            return
        seen = self._seen + piece
        at = seen.find(self._trigger)
        if at < 0:
            self._seen = seen[max(0, len(seen) - len(self._trigger) + 1):]  # where the trigger may yet begin
            return
        self.active, self._seen = True, b""
        rest = seen[at + len(self._trigger):]  # what the trigger's last token carried past it
        self._submit(self.vocab.tokenize(rest.decode("utf-8", errors="replace")) if rest else [])


class Guidance:
    """Constraining one model's output: llguidance's view of its vocabulary (built on first use, then
    kept) and the worker threads that compute masks while the model steps."""

    def __init__(self, tokenizer: Callable[[], object], n_vocab: int, source: str, overlap: bool = False):
        self._tokenizer, self.n_vocab, self.source = tokenizer, n_vocab, source
        self.overlap = overlap  # compute masks while steps run (a core the step does not use is free)
        self._lock = threading.Lock()
        self._vocab: GrammarVocab | None = None
        self._workers: ThreadPoolExecutor | None = None

    @property
    def vocab(self) -> GrammarVocab:
        with self._lock:
            if self._vocab is None:
                self._vocab = grammar_vocab(self._tokenizer(), self.n_vocab, self.source)
                self._workers = ThreadPoolExecutor(MASK_WORKERS, thread_name_prefix="kiln-mask")
            return self._vocab

    def matcher(self, c: Constraint) -> llguidance.LLMatcher:
        """A fresh matcher for c, checked: ConstraintError naming the field (and the schema path)
        if llguidance rejects it. Compiling may take a while for a large grammar (llguidance
        releases the GIL meanwhile): call it off any thread that must not wait."""
        grammar, vocab = c.grammar(), self.vocab
        try:
            m = llguidance.LLMatcher(vocab.lltokenizer, grammar, log_level=0, limits=_limits())
        except BaseException as e:
            if not _llguidance_failed(e):
                raise
            raise ConstraintError(f"{c.name}: llguidance could not compile it: {e}") from None
        if m.is_error():
            error = m.get_error()
            where = ""
            if c.kind == "json_schema":
                schema = json.loads(c.source)
                path = schema_path(schema) if isinstance(schema, dict) else ""
                where = f" at {path}" if path else ""
            raise ConstraintError(f"{c.name}{where}: {error}")
        return m

    def guide(self, c: Constraint) -> Guide:
        """One sequence's guide for c (its first mask starts computing at once)."""
        m = self.matcher(c)
        return Guide(self.vocab, m, self._workers, c, self.overlap)
