"""`kiln bench`: kiln and llama.cpp side by side on the same GGUF, the same threads, one run.

llama-bench's method: prompt processing (pp) times one prefill of N random tokens, text
generation (tg) times N single-token decodes, optionally after a prefill of `depth`
tokens that is not timed. Each test runs once to warm up, then `reps` times, alternating
engines so that a noisy neighbour hits both; medians are reported with kiln/llama.cpp ratios.
llama.cpp runs with flash attention off and on; the ratio is against the faster of the two.
ik_llama.cpp, the third engine, runs as its own llama-bench process a round, run-time repack off
and on (tools/ik_llama.py), with a second ratio against the faster of those.

Decode is bound by the rate at which the cores read memory, and on a shared machine that rate
moves from minute to minute. So each round of a decode test also measures it (runtime_c/bench/
read_bw.c) just before kiln's run and just after it, and takes the higher: measured once at the
round's end, after the other engines' runs, it had judged kiln's run by another minute's memory
(111% of the bound in one round, 50% in the next). The round's other engines are judged by it too.
"""
from __future__ import annotations

import json
import os
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Callable

import numpy as np

from ..ir.graph import Op, ValueKind


@dataclass(frozen=True)
class BenchTest:
    name: str
    n_prompt: int  # tokens prefilled and timed (pp)
    n_gen: int  # tokens decoded one by one and timed (tg)
    depth: int  # tokens prefilled first, untimed

    @property
    def n_timed(self) -> int:
        return self.n_prompt or self.n_gen


@dataclass(frozen=True)
class BenchResult:
    test: str
    kiln_tok_s: float
    llamacpp_tok_s: float  # the faster flash-attention setting
    ratio: float
    kiln_runs: list[float]
    llamacpp_runs: dict[str, list[float]]  # by setting: "fa off", "fa on"
    bandwidth_runs: list[float] = field(default_factory=list)  # GB/s read beside each round (decode tests)
    ik_runs: dict[str, list[float]] = field(default_factory=dict)  # by setting: "rtr off", "rtr on"; {} without ik
    ik_tok_s: float | None = None  # the faster repack setting
    ik_ratio: float | None = None  # kiln / ik_tok_s

    def of_bound(self, runs: list[float], bytes_per_token: int) -> float:
        """The median over rounds of a run's bytes read per second over the bandwidth of its round."""
        return statistics.median(s * bytes_per_token / (bw * 1e9) for s, bw in zip(runs, self.bandwidth_runs))

    @property
    def llamacpp_by_setting(self) -> dict[str, float]:
        return {k: statistics.median(v) for k, v in self.llamacpp_runs.items()}

    @property
    def ik_by_setting(self) -> dict[str, float]:
        return {k: statistics.median(v) for k, v in self.ik_runs.items()}


def default_tests(pp: int = 512, tg: int = 128, depth: int = 1024, pp_depth: int = 0) -> list[BenchTest]:
    """pp, tg and tg at depth; pp at depth too when pp_depth is given."""
    return [BenchTest(f"pp{pp}", pp, 0, 0), *([BenchTest(f"pp{pp}@d{pp_depth}", pp, 0, pp_depth)] if pp_depth else []),
            BenchTest(f"tg{tg}", 0, tg, 0), BenchTest(f"tg{tg}@d{depth}", 0, tg, depth)]


class _Engine:
    """One way to run a test: reset, untimed prefill of the depth, then the timed part."""

    def __init__(self, reset: Callable[[], None], prefill: Callable[[list[int]], None],
                 decode: Callable[[int], None]):
        self.reset, self.prefill, self.decode = reset, prefill, decode

    def run(self, t: BenchTest, tokens: list[int]) -> float:
        self.reset()
        if t.depth:
            self.prefill(tokens[:t.depth])
        start = time.perf_counter()
        if t.n_prompt:
            self.prefill(tokens[t.depth:t.depth + t.n_prompt])
        for tok in tokens[t.depth:t.depth + t.n_gen]:
            self.decode(tok)
        return t.n_timed / (time.perf_counter() - start)


def kiln_engine(model, ctx: int, threads: int | None, kv_dtype: str, build: dict | None = None) -> tuple[_Engine, object]:
    """kiln as kiln bench runs it; `build`: load()'s target and isa."""
    from ..runtime import load

    m = load(model, ctx=ctx, kv_dtype=kv_dtype, threads=threads, **(build or {}))
    return _Engine(m.reset, lambda ids: m.prefill(ids), lambda tok: m.decode(tok)), m


def llamacpp_engine(path, ctx: int, threads: int, kv_dtype: str, flash_attn: bool) -> _Engine:
    """llama.cpp as kiln bench runs it: batches of 512, and a decode step's logits copied out, as kiln's are."""
    from .llamacpp import LlamaCpp

    llm = LlamaCpp(path, n_ctx=ctx, kv_dtype=kv_dtype, n_batch=512, threads=threads, flash_attn=flash_attn)
    return _Engine(llm.reset, llm.eval, lambda tok: llm.eval([tok]))


IK = "ik "  # the prefix of ik_llama.cpp's settings among a round's engines


def run_bench(model, tests: list[BenchTest], threads: int, reps: int = 5, kv_dtype: str = "f32",
              log=lambda s: None, build: dict | None = None,
              bandwidth: Callable[[], float] | None = None, ik=None) -> list[BenchResult]:
    """bandwidth: measures the read bandwidth (GB/s), beside kiln's run in each counted round of a decode test.
    ik: an ik_llama.Runner of its llama-bench, a third engine in the same rounds, or None."""
    from . import ik_llama

    ctx = max(t.depth + t.n_timed for t in tests) + 1
    kiln, m = kiln_engine(model, ctx, threads, kv_dtype, build)
    from .llamacpp import flash_attn_settings

    engines = {"kiln": kiln, **{name: llamacpp_engine(m.spec.path, ctx, threads, kv_dtype, fa)
                                for name, fa in flash_attn_settings(kv_dtype).items()}}
    if ik is not None:
        engines |= {IK + name: e for name, e in ik_llama.bench_engines(ik, m.spec.path, threads, kv_dtype,
                                                                       moe=m.spec.hparams.n_expert > 0).items()}
    tokens = [int(t) for t in np.random.default_rng(0).integers(0, m.n_vocab, ctx)]
    results = []
    for t in tests:
        here = dict(engines)
        if t.n_prompt and t.depth and ik is not None:
            here = {n: e for n, e in here.items() if not n.startswith(IK)}
            log(f"{t.name}: llama-bench has no prompt at depth; ik_llama.cpp sits this test out")
        runs: dict[str, list[float]] = {name: [] for name in here}
        bw: list[float] = []
        for rep in range(reps + 1):  # the first round warms every engine up and is not counted
            for name in list(here):
                if name not in here:
                    continue  # ik, dropped this round
                beside = bool(rep and t.n_gen and bandwidth and name == "kiln")
                before = bandwidth() if beside else 0.0
                try:
                    speed = here[name].run(t, tokens)
                except ik_llama.IkError as e:  # a model ik cannot run: the bench goes on with two engines
                    log(f"ik_llama.cpp failed ({e}); going on without it")
                    here, engines, runs = ({n: v for n, v in d.items() if not n.startswith(IK)}
                                           for d in (here, engines, runs))
                    continue
                if rep:
                    runs[name].append(speed)
                if beside:
                    bw.append(max(before, bandwidth()))
        results.append(_result(t.name, runs, bw, log))
    return results


def _result(test: str, runs: dict[str, list[float]], bw: list[float], log) -> BenchResult:
    """The medians and ratios of a test's counted runs, by engine and setting."""
    med = statistics.median
    kiln_runs = runs.pop("kiln")
    ik_runs = {n.removeprefix(IK): runs.pop(n) for n in list(runs) if n.startswith(IK)}
    k = med(kiln_runs)
    best = max(med(v) for v in runs.values())
    ik_best = max((med(v) for v in ik_runs.values()), default=None)
    log(f"{test}: kiln {k:.1f} tok/s, llama.cpp " + ", ".join(f"{n} {med(v):.1f}" for n, v in runs.items())
        + "".join(f", ik {n} {med(v):.1f}" for n, v in ik_runs.items()))
    return BenchResult(test, k, best, k / best, kiln_runs, runs, bw, ik_runs, ik_best, k / ik_best if ik_best else None)


def decode_bytes_per_token(m) -> int:
    """Weight bytes one decode step reads: every weight it touches, one row of each table the
    embedding reads (token_embd, Gemma 4's per_layer_token_embd), and of a mixture of experts'
    tensors only the slices of the experts a token runs (k of n_expert)."""
    planned = m.compiled.planned
    tables = {v.name for n in planned.graph.head if n.op is Op.EMBED for v in n.inputs if v.kind is ValueKind.WEIGHT}
    total = planned.layout.expert_bytes_per_token - planned.layout.expert_bytes
    for b in planned.layout.region("weights"):
        total += b.size // b.shape[0] if b.name in tables else b.size
    return total


def decode_kv_bytes_per_token(m, t: BenchTest) -> int:
    """K and V bytes a timed token of test t reads, on average: at position p, every attention layer's
    rows of the positions it sees (p + 1, or its window), each of its kv heads. At depth 1024 they are
    a fifth of what SmolLM2 reads, so a bound of the weights alone could not be reached."""
    layers = m.compiled.planned.layout.kv.layers if m.compiled.planned.layout.kv else ()
    total = 0
    for p in range(t.depth, t.depth + t.n_gen):
        total += sum(ly.n_head_kv * (ly.k_row + ly.v_row) * min(p + 1, ly.window or p + 1) for ly in layers)
    return total // t.n_gen if t.n_gen else 0


def render(results: list[BenchResult], model: str, threads: int, bytes_per_token: int,
           bandwidth_numpy: float | None = None, kernels: str = "", ik_note: str = "",
           kv_bytes: dict[str, int] | None = None) -> str:
    """kv_bytes: by test, the K and V bytes its decoded token reads beside the weights (the bound's too)."""
    names = list(results[0].llamacpp_runs)
    iks = list(dict.fromkeys(n for r in results for n in r.ik_runs))  # ik's settings, where it ran
    vs_ik = "; vs ik = kiln / the faster ik_llama.cpp" if iks else ""
    out = [f"kiln bench: {model}, {threads} thread(s), medians; ratio = kiln / the faster llama.cpp{vs_ik}",
           *([f"kiln's kernels: {kernels}"] if kernels else []), *([ik_note] if iks and ik_note else []),
           f"{'test':<14} {'kiln tok/s':>11} " + " ".join(f"{'llama.cpp ' + n:>17}" for n in names)
           + "".join(f" {'ik ' + n:>11}" for n in iks) + f" {'ratio':>7}" + (f" {'vs ik':>7}" if iks else "")]
    for r in results:
        by, ik = r.llamacpp_by_setting, r.ik_by_setting
        out.append(f"{r.test:<14} {r.kiln_tok_s:>11.1f} " + " ".join(f"{by[n]:>17.1f}" for n in names)
                   + "".join(f" {ik[n]:>11.1f}" if n in ik else f" {'-':>11}" for n in iks) + f" {r.ratio:>6.2f}x"
                   + ((f" {r.ik_ratio:>6.2f}x" if r.ik_ratio else f" {'-':>7}") if iks else ""))
    judged = [r for r in results if r.bandwidth_runs]
    if judged:
        every = [bw for r in judged for bw in r.bandwidth_runs]
        numpy = f"; numpy reads {bandwidth_numpy:.1f}" if bandwidth_numpy else ""
        kv = {r.test: (kv_bytes or {}).get(r.test, 0) for r in judged}
        kv_note = ", ".join(f"{r.test} {kv[r.test] / 1e6:.1f} MB" for r in judged if kv[r.test])
        out.append(f"decode reads {bytes_per_token / 1e6:.1f} MB of weights per token"
                   + (f", and of K and V {kv_note}" if kv_note else "") + "; the read bandwidth, measured in "
                   f"each round ({threads} thread(s), runtime_c/bench/read_bw.c{numpy}), was {min(every):.1f}-"
                   f"{max(every):.1f} GB/s; each run against its round's:")
    for r in judged:
        best = max(r.llamacpp_runs, key=lambda n: statistics.median(r.llamacpp_runs[n]))
        ik = max(r.ik_runs, key=lambda n: statistics.median(r.ik_runs[n]), default=None)
        read = bytes_per_token + kv[r.test]
        of_ik = f", ik_llama.cpp at {100 * r.of_bound(r.ik_runs[ik], read):.0f}%" if ik else ""
        out.append(f"  {r.test}: kiln at {100 * r.of_bound(r.kiln_runs, read):.0f}% of the bound, "
                   f"llama.cpp at {100 * r.of_bound(r.llamacpp_runs[best], read):.0f}%{of_ik} "
                   f"(rounds at {statistics.median(r.bandwidth_runs):.1f} GB/s, median)")
    return "\n".join(out) + "\n"


def _cpu() -> dict:
    """The CPU a run was on, as /proc/cpuinfo names it (a VM's may lack the model number: family and
    model then say which generation), and how many CPUs the process could use."""
    info: dict[str, str] = {}
    try:
        for line in open("/proc/cpuinfo"):
            key, _, value = line.partition(":")
            info.setdefault(key.strip(), value.strip())
            if not line.strip():
                break  # the first CPU's block is enough
    except OSError:
        pass
    import platform

    return {"model": info.get("model name", platform.processor() or platform.machine()),
            "vendor": info.get("vendor_id", ""), "family": info.get("cpu family", ""), "model_id": info.get("model", ""),
            "cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
            "flags": sorted(info.get("flags", info.get("Features", "")).split())}


def _commit() -> dict:
    """The checkout's commit, and whether tracked files differed from it (a run from a wheel has none)."""
    import subprocess

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    try:
        head = subprocess.run(["git", "-C", root, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "-C", root, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}
    if head.returncode:
        return {"commit": None, "dirty": None}
    return {"commit": head.stdout.strip(), "dirty": bool(dirty.stdout.strip())}


def _llama_server_version(binary: str | None) -> str | None:
    import subprocess

    if not binary or binary == "none":
        return None
    try:
        out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = [ln for ln in (out.stdout + out.stderr).splitlines() if ln.startswith("version:")]
    return lines[0].removeprefix("version:").strip() if lines else None


def provenance(threads: int | None, llama_server: str | None = None, engines: dict | None = None) -> dict:
    """What a figure needs to be traced to its run: the command line, when, kiln's commit, the CPU
    and its flags, the threads, and the llama.cpp it was set beside (docs/figures/ keeps these files).
    engines: each rival's version and flags by name (ik_llama.cpp's build info and command lines)."""
    import shlex
    import sys
    from datetime import datetime, timezone

    from ..core.version import __version__

    try:
        from importlib.metadata import version

        llama_cpp = version("llama-cpp-python")
    except Exception:  # not installed: a run of kiln alone
        llama_cpp = None
    # The command line, where this process is the kiln command (python -m compiler included); a caller of
    # compiler.cli.main(argv) from Python, such as a test, has another, and none is recorded.
    prog = os.path.basename(sys.argv[0]) if sys.argv else ""
    command = shlex.join(["kiln", *sys.argv[1:]]) if prog in ("kiln", "__main__.py") else None
    return {"command": command, "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "kiln_version": __version__, **_commit(), "cpu": _cpu(), "threads": threads,
            "llama_cpp_python": llama_cpp, "llama_server": _llama_server_version(llama_server),
            **({"engines": engines} if engines else {}),
            # the machine's load at the end (1, 5 and 15 minutes): on a shared machine, how busy the run's neighbours were
            "loadavg": [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None}


def write_json(path: str | os.PathLike[str], results: list, llama_server: str | None = None,
               engines: dict | None = None, **meta) -> None:
    """Every file `kiln bench --json` and `kiln bench-serve --json` write: the run's results and
    settings, and its provenance (llama_server: the binary a serving run was set beside; engines:
    the rivals' versions and flags)."""
    rows = [asdict(r) if hasattr(r, "__dataclass_fields__") else r for r in results]
    doc = {**meta, "provenance": provenance(meta.get("threads"), llama_server, engines), "results": rows}
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
