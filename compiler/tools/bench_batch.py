"""`kiln bench --batch`: aggregate decode speed of B sequences at once, side by side with
llama.cpp's own multi-sequence decode.

Both engines hold B sequences, each prefilled (untimed) with `depth` tokens, then time `tg`
steps that each decode one token of every sequence. kiln runs `Model.step` over its paged
pool; llama.cpp runs what llama-batched-bench does through llama-cpp-python's low-level API:
one `llama_batch` of B rows, one sequence id per row, `llama_decode`, with its KV cache
unified across sequences. llama.cpp runs with flash attention off and on. ik_llama.cpp, the third
engine, runs its own llama-batched-bench in the same rounds, a process for each B and repack setting
(tools/ik_llama.py); its S_TG is the same aggregate decode speed.
"""
from __future__ import annotations

import shlex
import statistics
import time
from dataclasses import dataclass, field

import numpy as np

from .ik_llama import MULTI_SEQ_FA

@dataclass(frozen=True)
class BatchResult:
    batch: int
    kiln_tok_s: float
    llamacpp_tok_s: dict[str, float]  # by flash attention setting, "fa off" / "fa on"
    ik_tok_s: dict[str, float] = field(default_factory=dict)  # by repack setting, "rtr off" / "rtr on"; {}: no ik
    ik_flash_attn: bool | None = None  # off where ik's aborts on many sequences (ik_llama.multi_seq_flash_attn)

    @property
    def best_llamacpp(self) -> float:
        return max(self.llamacpp_tok_s.values())

    @property
    def ratio(self) -> float:
        return self.kiln_tok_s / self.best_llamacpp

    @property
    def ik_ratio(self) -> float | None:
        return self.kiln_tok_s / max(self.ik_tok_s.values()) if self.ik_tok_s else None


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


def llamacpp_batched(path, batch: int, depth: int, tg: int, threads: int, kv_dtype: str, flash_attn: bool):
    """llama.cpp's batched decode as llama-batched-bench runs it: B sequences in one unified cache,
    each prefilled with `depth` tokens, then `tg` steps of one llama_batch with a row per sequence.
    Returns run() -> aggregate tok/s, and the context (to close)."""
    from .llamacpp import LlamaCpp

    llm = LlamaCpp(path, n_ctx=batch * (depth + tg) + 64, kv_dtype=kv_dtype, n_batch=max(512, batch, depth),
                   threads=threads, flash_attn=flash_attn, n_seq=batch)

    def run() -> float:
        llm.reset()
        for s in range(batch):
            llm.decode([(t, p, s, True) for p, t in enumerate(_tokens(depth, llm.n_vocab, s))])
        toks = _tokens(tg * batch, llm.n_vocab, 99)
        start = time.perf_counter()
        for j in range(tg):
            llm.decode([(toks[j * batch + s], depth + j, s, True) for s in range(batch)])
        return batch * tg / (time.perf_counter() - start)

    return run, llm


def run_batch_bench(model, batches: list[int], depth: int, tg: int, threads: int, reps: int, kv_dtype: str,
                    log=lambda s: None, build: dict | None = None, ik=None) -> list[BatchResult]:
    """ik: an ik_llama.Runner of its llama-batched-bench, or None."""
    from ..runtime import load
    from . import ik_llama

    m = load(model, ctx=depth + tg + 1, n_seq=max(batches), kv_dtype=kv_dtype, threads=threads,
             batch_tokens=max(max(batches), 256), **(build or {}))
    from .llamacpp import flash_attn_settings

    settings = flash_attn_settings(kv_dtype)
    ik_fa = ik_llama.multi_seq_flash_attn(ik.binary, m.spec.path, threads) if ik and max(batches) > 1 else True
    if ik and not ik_fa:
        ik.commands["flash attention probe, aborted"] = shlex.join(ik_llama.probe_argv(ik.binary, m.spec.path,
                                                                                        threads))
        log(ik_llama.MULTI_SEQ_FA)
    results = []
    for batch in batches:
        refs = {name: llamacpp_batched(m.spec.path, batch, depth, tg, threads, kv_dtype, fa)
                for name, fa in settings.items()}
        runs: dict[str, list[float]] = {"kiln": [], **{name: [] for name in refs}}
        ik_runs: dict[str, list[float]] = {name: [] for name in ik_llama.REPACK} if ik else {}
        try:
            for rep in range(reps + 1):  # the first round warms up and is not counted
                speeds = {"kiln": kiln_batched(m, batch, depth, tg)}
                speeds |= {name: run() for name, (run, _) in refs.items()}
                if rep:
                    for name, v in speeds.items():
                        runs[name].append(v)
                for name, rtr in ik_llama.REPACK.items() if ik_runs else ():
                    try:
                        v = ik_llama.batched_speeds(ik, m.spec.path, [batch], depth, tg, threads, kv_dtype, rtr,
                                                    f"B={batch} {name}", ik_fa or batch == 1)[batch]
                    except ik_llama.IkError as e:  # a model ik cannot run: go on with two engines
                        log(f"ik_llama.cpp failed ({e}); going on without it")
                        ik, ik_runs = None, {}
                        break
                    if rep:
                        ik_runs[name].append(v)
        finally:
            for _, llm in refs.values():
                llm.close()
        med = {name: statistics.median(v) for name, v in runs.items()}
        r = BatchResult(batch, med.pop("kiln"), med, {n: statistics.median(v) for n, v in ik_runs.items() if v},
                        (ik_fa or batch == 1) if ik_runs else None)
        log(f"batch {batch}: kiln {r.kiln_tok_s:.1f} tok/s, llama.cpp "
            + ", ".join(f"{k} {v:.1f}" for k, v in r.llamacpp_tok_s.items())
            + "".join(f", ik {k} {v:.1f}" for k, v in r.ik_tok_s.items()))
        results.append(r)
    return results


def render_batch(results: list[BatchResult], model: str, threads: int, depth: int, tg: int, kv_dtype: str) -> str:
    names = list(results[0].llamacpp_tok_s)
    iks = list(dict.fromkeys(n for r in results for n in r.ik_tok_s))
    out = [f"batched decode: {model}, {threads} thread(s), depth {depth}, {tg} steps, {kv_dtype} KV; aggregate tok/s, "
           "medians; ratio = kiln / the faster llama.cpp" + ("; vs ik = kiln / the faster ik_llama.cpp" if iks else ""),
           *([MULTI_SEQ_FA] if any(r.ik_flash_attn is False for r in results) else []),
           f"{'B':>4} {'kiln':>9} {'x B=1':>7} " + " ".join(f"{'llama.cpp ' + n:>17}" for n in names)
           + "".join(f" {'ik ' + n:>11}" for n in iks) + f" {'ratio':>7}" + (f" {'vs ik':>7}" if iks else "")]
    base = results[0].kiln_tok_s if results[0].batch == 1 else None
    for r in results:
        scale = f"{r.kiln_tok_s / base:>6.2f}x" if base else f"{'-':>7}"
        out.append(f"{r.batch:>4} {r.kiln_tok_s:>9.1f} {scale} "
                   + " ".join(f"{r.llamacpp_tok_s[n]:>17.1f}" for n in names)
                   + "".join(f" {r.ik_tok_s[n]:>11.1f}" if n in r.ik_tok_s else f" {'-':>11}" for n in iks)
                   + f" {r.ratio:>6.2f}x" + ((f" {r.ik_ratio:>6.2f}x" if r.ik_ratio else f" {'-':>7}") if iks else ""))
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
