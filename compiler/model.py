"""The Python face of a compiled model: `compiler.load(...)` returns a Model.

Python does no per-op work: each call is one C call that runs whole steps. Each Model owns
its own C instance (weights mapping, KV region, arena), so any number can live in one process.
"""
from __future__ import annotations

import codecs
import hashlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import numpy as np

from .build import CSource, header_cdef, load_extension, runtime_sources
from .codegen import Generated, generate
from .errors import KilnError, OptionError
from .ir import Mode
from .options import CompileOptions
from .packing import packed_file
from .pipeline import Planned, plan
from .registry import cache_dir
from .sampling import Sampler, SamplingParams
from .tokenizer import make_tokenizer


class ModelError(KilnError):
    """A call on a loaded model was refused (bad token, full context, bad rollback, wrong weights)."""


@dataclass(frozen=True)
class Compiled:
    decode: Planned
    prefill: Planned
    source: Generated
    source_dir: Path
    module: ModuleType
    packed_path: Path | None  # the packed weights file the library maps; None: every weight from the GGUF


def compile_model(model: str | os.PathLike[str], opts: CompileOptions, sanitize: bool = False,
                  log=lambda s: None) -> Compiled:
    decode, prefill = plan(model, opts, Mode.DECODE, log), plan(model, opts, Mode.PREFILL, log)
    src = generate(decode, prefill)
    digest = hashlib.sha256((src.model_c + src.model_h).encode()).hexdigest()[:24]
    src_dir = cache_dir() / "src" / digest
    if not (src_dir / "model.c").is_file():
        src_dir.mkdir(parents=True, exist_ok=True)
        for name, text in (("model.h", src.model_h), ("model.c", src.model_c)):
            tmp = src_dir / f".{name}.{os.getpid()}"
            tmp.write_text(text)
            os.replace(tmp, src_dir / name)
    module = load_extension(CSource("model", header_cdef(src_dir / "model.h"), '#include "model.h"',
                                    (src_dir / "model.c", *runtime_sources()), (src_dir,), sanitize), log)
    packed = packed_file(decode.spec, decode.layout.packed, cache_dir(), log)
    return Compiled(decode, prefill, src, src_dir, module, packed)


def _status_messages(m: "Model") -> dict[int, str]:
    lib = m._lib
    return {
        lib.KILN_E_ARG: "invalid argument",
        lib.KILN_E_TOKEN: f"token id out of range [0, {m.n_vocab})",
        lib.KILN_E_CTX_FULL: f"context full: the tokens do not fit in n_ctx={m.n_ctx} (n_past={m.n_past}); "
                             "reset(), rollback(), or compile with a larger ctx",
        lib.KILN_E_ROLLBACK: f"rollback beyond the cache: it holds n_past={m.n_past} positions",
        lib.KILN_E_ROLLBACK_RING: "rollback further back than the sliding-window rings remember (always "
                                  f"{lib.kiln_rollback_limit()} positions back, or to 0); reset() and prefill again",
        lib.KILN_E_OPEN: f"{m.path}: cannot open or map the weights file",
        lib.KILN_E_WEIGHTS: f"{m.path}: this is not the weights file the library was compiled for "
                            f"(expected {lib.kiln_weights_size():,} bytes and the same header); recompile for it",
        lib.KILN_E_NOMEM: "out of memory allocating the KV region or the arena",
        lib.KILN_E_PACKED: f"{m.compiled.packed_path}: not the packed weights file for {m.path} (or unreadable); "
                           "delete it and load again to rewrite it",
    }


class Model:
    """A loaded model: one C instance with its own KV cache and arena."""

    def __init__(self, compiled: Compiled, weights_path: str | os.PathLike[str] | None = None,
                 threads: int | None = None):
        self.compiled = compiled
        self.spec = compiled.decode.spec
        self.options = compiled.decode.options
        self.path = Path(weights_path) if weights_path is not None else self.spec.path
        self._ffi, self._lib = compiled.module.ffi, compiled.module.lib
        self.n_vocab = int(self._lib.kiln_n_vocab())
        self.n_ctx = int(self._lib.kiln_n_ctx())
        self._tokenizer = None
        self.tokens: list[int] = []  # what the cache holds, for prefix reuse
        handle = self._ffi.new("kiln_model **")
        packed = str(compiled.packed_path).encode() if compiled.packed_path else self._ffi.NULL
        self._check(self._lib.kiln_open(handle, str(self.path).encode(), packed, threads or default_threads()))
        self._m = self._ffi.gc(handle[0], self._lib.kiln_close)

    def _check(self, status: int) -> None:
        if status != 0:
            raise ModelError(_status_messages(self).get(status, f"kiln error {status}"))

    @property
    def n_threads(self) -> int:
        return int(self._lib.kiln_n_threads(self._m))

    @property
    def n_past(self) -> int:
        return int(self._lib.kiln_n_past(self._m)) if hasattr(self, "_m") else 0

    def _eval(self, ids, logits_all: bool) -> np.ndarray:
        tokens = np.ascontiguousarray(ids, dtype=np.int64)
        if tokens.ndim != 1 or tokens.size == 0:
            raise ModelError("expected a non-empty 1-D sequence of token ids")
        bad = np.flatnonzero((tokens < 0) | (tokens >= self.n_vocab))
        if bad.size:
            raise ModelError(f"token id {int(tokens[bad[0]])} at index {int(bad[0])} is out of range [0, {self.n_vocab})")
        tokens = tokens.astype(np.int32)
        out = np.empty((tokens.size if logits_all else 1, self.n_vocab), dtype=np.float32)
        self._check(self._lib.kiln_eval(self._m, self._ffi.cast("int32_t *", self._ffi.from_buffer(tokens)),
                                        tokens.size, self._ffi.cast("float *", self._ffi.from_buffer(out)),
                                        int(logits_all)))
        self.tokens.extend(int(t) for t in tokens)
        return out if logits_all else out[0]

    @property
    def tokenizer(self):
        """Built on first use, so that a model whose tokenizer kiln cannot build still runs on ids."""
        if self._tokenizer is None:
            self._tokenizer = make_tokenizer(self.spec.tokenizer, str(self.spec.path))
        return self._tokenizer

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        """llama.cpp's llama_tokenize: BOS only where the GGUF asks for it; special-token text to ids."""
        return self.tokenizer.tokenize(text, add_special, parse_special)

    def detokenize(self, ids, special: bool = False) -> str:
        return self.tokenizer.detokenize(ids, special)

    def prefill(self, ids, logits: str = "last") -> np.ndarray:
        """Append `ids` to the cache; the last token's logits [vocab], or all of them [len(ids), vocab]."""
        if logits not in ("last", "all"):
            raise OptionError(f"logits must be 'last' or 'all', got {logits!r}")
        return self._eval(ids, logits == "all")

    def decode(self, token: int) -> np.ndarray:
        """Append one token; its logits [vocab]."""
        return self._eval([int(token)], False)

    def reset(self) -> None:
        self._check(self._lib.kiln_reset(self._m))
        self.tokens.clear()

    def rollback(self, n: int) -> None:
        """Keep the first `n` positions of the cache."""
        if n < 0 or n > self.n_past:
            raise ModelError(f"rollback({n}): the cache holds n_past={self.n_past} positions")
        self._check(self._lib.kiln_rollback(self._m, int(n)))
        del self.tokens[n:]

    def _reuse_prefix(self, ids: list[int]) -> list[int]:
        """Roll back to the longest prefix the cache shares with `ids`; return what is left to prefill."""
        k = 0
        for a, b in zip(self.tokens, ids):
            if a != b:
                break
            k += 1
        k = min(k, len(ids) - 1)  # at least one token must run to produce logits
        try:
            self.rollback(k)
        except ModelError:  # a sliding ring cannot go back that far: start over
            self.reset()
            k = 0
        return ids[k:]

    def generate(self, prompt: str | list[int], max_tokens: int = 128, temperature: float = 0.8, top_k: int = 40,
                 top_p: float = 0.95, min_p: float = 0.05, repeat_penalty: float = 1.0, seed: int | None = None,
                 stop: list[str] | str | None = None, stream: bool = False) -> str | Iterator[str]:
        """Continue `prompt` (text, or token ids). Returns the text, or yields it piece by piece if stream."""
        params = SamplingParams(temperature, top_k, top_p, min_p, repeat_penalty, seed=seed)
        pieces = self._generate(prompt, max_tokens, params, [stop] if isinstance(stop, str) else list(stop or []))
        return pieces if stream else "".join(pieces)

    def _generate(self, prompt, max_tokens: int, params: SamplingParams, stops: list[str]) -> Iterator[str]:
        ids = self.tokenize(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
        if not ids:
            raise ModelError("generate: the prompt is empty")
        if len(ids) > self.n_ctx:
            raise ModelError(f"generate: the prompt has {len(ids)} tokens but n_ctx is {self.n_ctx}")
        logits = self.prefill(self._reuse_prefix(ids))
        sample, history = Sampler(params), list(ids)
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        text, emitted = "", 0
        eos = self.spec.tokenizer.eos_id
        for _ in range(max_tokens):
            tok = sample(logits, history)
            if tok == eos:
                break
            history.append(tok)
            text += decoder.decode(self.tokenizer.token_bytes(tok))
            cut = min((i for i in (text.find(s) for s in stops) if i >= 0), default=-1)
            if cut >= 0:
                yield text[emitted:cut]
                return
            # hold back a tail that could still become a stop string
            hold = max((len(s) - 1 for s in stops), default=0)
            if len(text) - hold > emitted:
                yield text[emitted:len(text) - hold]
                emitted = len(text) - hold
            if _ + 1 == max_tokens or self.n_past >= self.n_ctx:
                break
            logits = self.decode(tok)
        yield text[emitted:] + decoder.decode(b"", final=True)


def load(model: str | os.PathLike[str], ctx: int = 2048, kv_dtype: str = "f32", threads: int | None = None,
         prefill_chunk: int = CompileOptions.prefill_chunk, sanitize: bool = False, log=lambda s: None) -> Model:
    """Compile (or reuse the cached build of) `model` and load it. `model` is a GGUF path or a bundled name."""
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise OptionError(f"threads must be a positive integer, got {threads!r}")
    opts = CompileOptions(ctx=ctx, kv_dtype=kv_dtype, prefill_chunk=prefill_chunk)
    return Model(compile_model(model, opts, sanitize, log), threads=threads)


def default_threads() -> int:
    """Physical cores this process may run on: SMT siblings share one core's units and would
    only contend in the matmuls."""
    try:
        cpus = os.sched_getaffinity(0)
    except AttributeError:
        return os.cpu_count() or 1
    cores = set()
    for cpu in cpus:
        topo = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
        try:
            cores.add((topo.joinpath("physical_package_id").read_text(), topo.joinpath("core_id").read_text()))
        except OSError:
            cores.add(("cpu", str(cpu)))
    return max(1, len(cores))
