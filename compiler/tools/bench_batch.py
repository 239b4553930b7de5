"""`kiln bench --batch`: aggregate decode speed of B sequences at once, side by side with
llama.cpp's own multi-sequence decode.

Both engines hold B sequences, each prefilled (untimed) with `depth` tokens, then time `tg`
steps that each decode one token of every sequence. kiln runs `Model.step` over its paged
pool; llama.cpp runs what llama-batched-bench does through llama-cpp-python's low-level API:
one `llama_batch` of B rows, one sequence id per row, `llama_decode`, with its KV cache
unified across sequences. llama.cpp runs with flash attention off and on.
"""
from __future__ import annotations

import ctypes
import statistics
import time
from dataclasses import dataclass

import numpy as np

from .bench import LLAMACPP_KV_TYPES, flash_attn_settings
from ..core.errors import KilnError


@dataclass(frozen=True)
class BatchResult:
    batch: int
    kiln_tok_s: float
    llamacpp_tok_s: dict[str, float]  # by flash attention setting, "fa off" / "fa on"

    @property
    def best_llamacpp(self) -> float:
        return max(self.llamacpp_tok_s.values())

    @property
    def ratio(self) -> float:
        return self.kiln_tok_s / self.best_llamacpp


def _tokens(n: int, vocab: int, seed: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(0, vocab, n)]


def kiln_batched(m, batch: int, depth: int, tg: int) -> float:
    seqs = [m.sequence() for _ in range(batch)]
    try:
        for i, s in enumerate(seqs):
            s.prefill(_tokens(depth, m.n_vocab, i))
        toks = _tokens(tg * batch, m.n_vocab, 99)
        start = time.perf_counter()
        for j in range(tg):
            m.step([(s, toks[j * batch + i]) for i, s in enumerate(seqs)])
        return batch * tg / (time.perf_counter() - start)
    finally:
        for s in seqs:
            s.close()


def _quiet():
    try:
        import llama_cpp as L
    except ImportError:
        return None
    return L.llama_log_callback(lambda level, text, user_data: None)


_QUIET = _quiet()  # kept alive: llama.cpp calls it for every log line


class LlamaBatched:
    """llama.cpp's batched decode, as llama-batched-bench runs it."""

    def __init__(self, path, batch: int, depth: int, tg: int, threads: int, kv_dtype: str, flash_attn: bool):
        try:
            import llama_cpp as L
        except ImportError:
            raise KilnError("kiln bench compares against llama.cpp: install llama-cpp-python (`make dev` does)") from None
        self.L = L
        L.llama_log_set(_QUIET, ctypes.c_void_p())
        L.llama_backend_init()
        mp = L.llama_model_default_params()
        self.model = L.llama_model_load_from_file(str(path).encode(), mp)
        if not self.model:
            raise KilnError(f"{path}: llama.cpp could not load it")
        cp = L.llama_context_default_params()
        cp.n_ctx = batch * (depth + tg) + 64
        cp.n_batch = cp.n_ubatch = max(512, batch)
        cp.n_seq_max = batch
        cp.kv_unified = True
        cp.n_threads = cp.n_threads_batch = threads
        cp.type_k = cp.type_v = LLAMACPP_KV_TYPES[kv_dtype]
        cp.flash_attn_type = 1 if flash_attn else 0
        self.ctx = L.llama_init_from_model(self.model, cp)
        if not self.ctx:
            raise KilnError(f"llama.cpp could not make a context for {batch} sequences")
        self.batch, self.depth, self.tg = batch, depth, tg
        self.n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(self.model))
        self.b = L.llama_batch_init(max(depth, batch), 0, 1)

    def _decode(self, rows: list[tuple[int, int, int]]) -> None:
        b = self.b
        for i, (tok, pos, seq) in enumerate(rows):
            b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = tok, pos, 1, 1
            b.seq_id[i][0] = seq
        b.n_tokens = len(rows)
        if self.L.llama_decode(self.ctx, b) != 0:
            raise KilnError("llama.cpp: llama_decode failed")

    def run(self) -> float:
        L = self.L
        L.llama_memory_clear(L.llama_get_memory(self.ctx), True)
        for s in range(self.batch):
            self._decode([(t, p, s) for p, t in enumerate(_tokens(self.depth, self.n_vocab, s))])
        toks = _tokens(self.tg * self.batch, self.n_vocab, 99)
        start = time.perf_counter()
        for j in range(self.tg):
            self._decode([(toks[j * self.batch + s], self.depth + j, s) for s in range(self.batch)])
        return self.batch * self.tg / (time.perf_counter() - start)

    def close(self) -> None:
        L = self.L
        L.llama_batch_free(self.b)
        L.llama_free(self.ctx)
        L.llama_model_free(self.model)


def run_batch_bench(model, batches: list[int], depth: int, tg: int, threads: int, reps: int, kv_dtype: str,
                    log=lambda s: None) -> list[BatchResult]:
    from ..runtime import load

    m = load(model, ctx=depth + tg + 1, n_seq=max(batches), kv_dtype=kv_dtype, threads=threads,
             batch_tokens=max(max(batches), 256))
    settings = flash_attn_settings(kv_dtype)
    results = []
    for batch in batches:
        refs = {name: LlamaBatched(m.spec.path, batch, depth, tg, threads, kv_dtype, fa) for name, fa in settings.items()}
        runs: dict[str, list[float]] = {"kiln": [], **{name: [] for name in refs}}
        try:
            for rep in range(reps + 1):  # the first round warms up and is not counted
                speeds = {"kiln": kiln_batched(m, batch, depth, tg)}
                speeds |= {name: ref.run() for name, ref in refs.items()}
                if rep:
                    for name, v in speeds.items():
                        runs[name].append(v)
        finally:
            for ref in refs.values():
                ref.close()
        med = {name: statistics.median(v) for name, v in runs.items()}
        r = BatchResult(batch, med.pop("kiln"), med)
        log(f"batch {batch}: kiln {r.kiln_tok_s:.1f} tok/s, llama.cpp "
            + ", ".join(f"{k} {v:.1f}" for k, v in r.llamacpp_tok_s.items()))
        results.append(r)
    return results


def render_batch(results: list[BatchResult], model: str, threads: int, depth: int, tg: int, kv_dtype: str) -> str:
    names = list(results[0].llamacpp_tok_s)
    out = [f"batched decode: {model}, {threads} thread(s), depth {depth}, {tg} steps, {kv_dtype} KV; aggregate tok/s, "
           "medians; ratio = kiln / the faster llama.cpp",
           f"{'B':>4} {'kiln':>9} {'x B=1':>7} " + " ".join(f"{'llama.cpp ' + n:>17}" for n in names) + f" {'ratio':>7}"]
    base = results[0].kiln_tok_s if results[0].batch == 1 else None
    for r in results:
        scale = f"{r.kiln_tok_s / base:>6.2f}x" if base else f"{'-':>7}"
        out.append(f"{r.batch:>4} {r.kiln_tok_s:>9.1f} {scale} "
                   + " ".join(f"{r.llamacpp_tok_s[n]:>17.1f}" for n in names) + f" {r.ratio:>6.2f}x")
    return "\n".join(out) + "\n"


def run_page_size_sweep(model, sizes: list[int], depths: list[int], tg: int, threads: int, reps: int, kv_dtype: str,
                        log=lambda s: None) -> dict[int, dict[int, float]]:
    """kiln's one-sequence decode tok/s at each depth, for each page size: {size: {depth: tok/s}}."""
    from ..runtime import load

    out: dict[int, dict[int, float]] = {}
    for size in sizes:
        m = load(model, ctx=max(depths) + tg + 1, kv_dtype=kv_dtype, page_size=size, threads=threads)
        out[size] = {d: statistics.median([kiln_batched(m, 1, d, tg) for _ in range(reps)]) for d in depths}
        log(f"page size {size}: " + ", ".join(f"depth {d} {v:.1f} tok/s" for d, v in out[size].items()))
    return out


def render_page_sizes(sweep: dict[int, dict[int, float]], model: str, threads: int, tg: int, kv_dtype: str) -> str:
    depths = list(next(iter(sweep.values())))
    out = [f"page size sweep: {model}, {threads} thread(s), one sequence decoding {tg} tokens, {kv_dtype} KV; "
           "tok/s, medians",
           f"{'page':>5} " + " ".join(f"{'depth ' + str(d):>11}" for d in depths)]
    out += [f"{size:>5} " + " ".join(f"{row[d]:>11.1f}" for d in depths) for size, row in sweep.items()]
    return "\n".join(out) + "\n"
