"""`kiln bench --profile`: where a prefill's time goes, by kernel, against the machine's int8 peak.

A profiling build of the model (-DKILN_PROFILE) charges each op the wall time from the end of
the op before it to the end of its own barrier, so the ops' times add up to the step's. The
matmuls' multiply-adds are counted from their shapes and rows, attention's from the positions
each query reads (its window, for sliding layers); dividing by the time gives each kernel's rate,
and the matmuls' by the peak that runtime_c/bench/vnni_peak.c measures on this machine, and by
the ceiling it measures for kernels that keep each row the reference dot's bits: the same chains
beside each block's float multiply and fma, which no reordering removes.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..build.cc import header_cdef
from ..build.extension import Extension, load_extension
from ..ir.graph import Op, ValueKind
from ..core.options import CompileOptions

from ..core.paths import RUNTIME_DIR  # noqa: E402
BENCH_DIR = RUNTIME_DIR / "bench"


@dataclass(frozen=True)
class Peak:
    isa: str
    macs_per_s: float  # int8 multiply-adds per second over all threads
    threads: int
    amx_macs_per_s: float | None = None  # the same by AMX tile multiplies, where this machine has them
    exact_macs_per_s: float = 0.0  # the same beside each 32-weight block's float steps: the exact kernels' ceiling


def int8_peak(threads: int, log=lambda s: None) -> Peak:
    """The best of five runs of the VNNI microbenchmark, each about 0.2 s; its exact blocks' and the AMX
    one likewise."""
    mod = load_extension(Extension("int8_peak", header_cdef(BENCH_DIR / "vnni_peak.h"), '#include "vnni_peak.h"',
                                   (BENCH_DIR / "vnni_peak.c",), (BENCH_DIR,)), log)
    isa = mod.ffi.string(mod.lib.kiln_int8_isa()).decode()
    probe = mod.lib.kiln_int8_peak(1, 1 << 16)
    iters = max(1 << 16, int(0.2 * probe / (16 * 64))) if probe > 0 else 1
    best = max(mod.lib.kiln_int8_peak(threads, iters) for _ in range(5))
    exact = max(mod.lib.kiln_int8_exact_peak(threads, iters) for _ in range(5))
    amx_probe = mod.lib.kiln_amx_int8_peak(1, 1 << 12)
    amx = None
    if amx_probe > 0:
        amx_iters = max(1 << 12, int(0.2 * amx_probe / (4 * 16 * 16 * 64)))
        amx = max(mod.lib.kiln_amx_int8_peak(threads, amx_iters) for _ in range(5))
    return Peak(isa, best, threads, amx, exact)


@dataclass
class KernelTime:
    kernel: str
    op: str
    count: int = 0  # ops of this kernel in the graph
    seconds: float = 0.0  # per run (one pp prefill)
    macs: int = 0  # multiply-adds per run: int8 for the matmuls, f32 for attention
    int8: bool = False


@dataclass
class Profile:
    model: str
    threads: int
    pp: int
    depth: int
    chunk: int
    seconds: float  # wall time of one pp prefill (median)
    kernels: list[KernelTime] = field(default_factory=list)
    peak: Peak | None = None
    target: str = "native"  # the kiln build profiled (build/targets.py), and the kernel paths it holds
    isa: str | None = None
    kernel_paths: str = ""

    @property
    def int8_macs(self) -> int:
        return sum(k.macs for k in self.kernels if k.int8)

    @property
    def int8_seconds(self) -> float:
        return sum(k.seconds for k in self.kernels if k.int8)


def _positions(depth: int, pp: int, chunk: int) -> list[np.ndarray]:
    """The positions of each prefill step's rows."""
    return [np.arange(depth + s, depth + min(s + chunk, pp)) for s in range(0, pp, chunk)]


def _kernel_name(g, node) -> str:
    """A kernel as the profile reports it: a matmul with its weights' types (a body op runs each layer's)."""
    w = next((v for v in node.inputs if v.kind is ValueKind.WEIGHT), None)
    if node.op not in (Op.MATMUL, Op.LOGITS) or w is None:
        return node.kernel
    return f"{node.kernel} {'/'.join(sorted({t.dtype.label for t in g.tensors(w)}))}"


def _int8(g, weights) -> bool:
    """Whether every tensor of these weight values is quantized (its dot runs on int8)."""
    return all(t.dtype.label not in ("f32", "f16", "bf16") for w in weights for t in g.tensors(w))


def _macs(g, index: int, node, steps: list[np.ndarray], n_head: int) -> tuple[int, bool]:
    """Multiply-adds of one op over a run's steps (a body op over every layer), and whether they are
    int8 (quantized matmuls and experts)."""
    section = g.section_of(index)
    layers = g.layers_of(section) if g.is_body(section) else (None,)
    if node.op in (Op.MATMUL, Op.LOGITS):
        w = next(v for v in node.inputs if v.kind is ValueKind.WEIGHT)
        n_out, n_in = w.shape[0], w.shape[-1]
        rows = 1 if node.op is Op.LOGITS else sum(len(p) for p in steps)  # kiln_eval wants the last row's logits
        return n_out * n_in * rows * len(layers), _int8(g, [w])
    if node.op is Op.MOE_FFN:  # each row through its n_used experts' matrices (not their biases or scales)
        mats = [w for part, w in zip(node.attrs.parts, node.inputs[3:]) if part in ("gate", "up", "down", "gate_up")]
        rows = sum(len(p) for p in steps)
        return rows * node.attrs.n_used * sum(w.shape[-2] * w.shape[-1] for w in mats) * len(layers), _int8(g, mats)
    if node.op is Op.ATTENTION:
        head_dim = node.inputs[0].shape[-1]
        reads = sum(int(np.minimum(p + 1, ly.window).sum()) if ly.window else int((p + 1).sum())
                    for ly in layers for p in steps)
        return 2 * n_head * head_dim * reads, False
    return 0, False


def run_profile(model: str, threads: int, pp: int, depth: int, reps: int, kv_dtype: str, log=lambda s: None,
                target: str = "native", isa: str | None = None) -> Profile:
    """target, isa: the kiln build to profile, as `kiln bench --target/--isa` (the peak stays this CPU's)."""
    from ..build.targets import kernel_set
    from ..runtime import load_options

    opts = CompileOptions(ctx=depth + pp + 1, kv_dtype=kv_dtype)
    m = load_options(model, opts, threads, log=log, profile=True, target=target, isa=isa)
    g = m.compiled.planned.graph
    nodes = g.nodes
    rng = np.random.default_rng(0)
    ids = rng.integers(0, m.n_vocab, depth + pp).tolist()
    totals, walls = np.zeros(len(nodes)), []
    for rep in range(reps + 1):  # the first run warms up
        m.reset()
        if depth:
            m.prefill(ids[:depth])
        m.op_seconds()
        t0 = time.perf_counter()
        m.prefill(ids[depth:])
        wall = time.perf_counter() - t0
        per_op = m.op_seconds()
        if rep:
            totals += per_op
            walls.append(wall)
    per_run = totals / reps
    steps = _positions(depth, pp, opts.prefill_chunk)
    by_kernel: dict[tuple[str, str], KernelTime] = {}  # the logits' matmul is its own row, not the layers'
    for i, (node, secs) in enumerate(zip(nodes, per_run)):
        name = _kernel_name(g, node)
        k = by_kernel.setdefault((name, node.op.value), KernelTime(name, node.op.value))
        macs, int8 = _macs(g, i, node, steps, m.spec.hparams.n_head)
        k.count, k.seconds, k.macs, k.int8 = k.count + 1, k.seconds + float(secs), k.macs + macs, int8 or k.int8
    name = Path(str(model)).name
    ext = m.compiled.extension
    return Profile(name, m.n_threads, pp, depth, opts.prefill_chunk, float(np.median(walls)),
                   sorted(by_kernel.values(), key=lambda k: -k.seconds), int8_peak(m.n_threads, log),
                   target, isa, kernel_set(ext.sanitize, ext.target, ext.isa))


def render(p: Profile) -> str:
    total = sum(k.seconds for k in p.kernels)
    out = [f"kiln bench --profile: {p.model}, pp{p.pp}" + (f" on top of {p.depth} cached tokens" if p.depth else "")
           + f", prefill chunks of {p.chunk}, {p.threads} thread(s)",
           f"kiln's kernels: {p.kernel_paths} (target {p.target}" + (f", --isa {p.isa}" if p.isa else "") + ")",
           f"one prefill: {p.seconds * 1e3:.1f} ms ({p.pp / p.seconds:.1f} tok/s); the ops' times add up to "
           f"{total * 1e3:.1f} ms",
           f"{'kernel':<28} {'op':<20} {'ops':>4} {'ms':>8} {'share':>6} {'GMAC/s':>8} {'of peak':>8}"]
    peak = p.peak.macs_per_s if p.peak and p.peak.macs_per_s > 0 else None
    for k in p.kernels:
        rate = k.macs / k.seconds / 1e9 if k.macs and k.seconds else None
        of_peak = f"{100 * k.macs / k.seconds / peak:7.1f}%" if (k.int8 and peak and k.seconds) else ""
        out.append(f"{k.kernel:<28} {k.op:<20} {k.count:>4} {k.seconds * 1e3:>8.2f} {100 * k.seconds / total:>5.1f}% "
                   f"{(f'{rate:8.1f}' if rate else ''):>8} {of_peak:>8}")
    if peak:
        macs, secs = p.int8_macs, p.int8_seconds
        experts = " and experts" if any(k.op == Op.MOE_FFN.value for k in p.kernels) else ""
        out += [f"int8 peak ({p.peak.isa}, {p.peak.threads} thread(s), runtime_c/bench/vnni_peak.c): "
                f"{peak / 1e9:.1f} GMAC/s",
                f"the quantized matmuls{experts}: {macs / 1e9:.2f} GMAC in {secs * 1e3:.1f} ms = {macs / secs / 1e9:.1f} GMAC/s, "
                f"{100 * macs / secs / peak:.1f}% of peak; over the whole prefill {macs / p.seconds / 1e9:.1f} GMAC/s, "
                f"{100 * macs / p.seconds / peak:.1f}% of peak"]
        exact = p.peak.exact_macs_per_s
        if exact > 0:
            out.append(f"beside each block's float steps that keep a row the reference dot's bits (a multiply of the "
                       f"scales and an fma each 8 {'vpdpbusd' if 'vpdpbusd' in p.peak.isa else 'steps'}; the types with "
                       f"a minimum take one fma more): {exact / 1e9:.1f} GMAC/s, {100 * exact / peak:.1f}% of peak, "
                       f"the exact kernels' ceiling; the quantized matmuls{experts} reach {100 * macs / secs / exact:.1f}% "
                       "of it")
        if p.peak.amx_macs_per_s:
            out.append(f"AMX tile multiplies (tdpbssd, runtime_c/bench/vnni_peak.c): {p.peak.amx_macs_per_s / 1e9:.1f} "
                       "GMAC/s; prefill takes the 32-weight types' integer sums from them, and the float steps "
                       "around the sums run on the vector units, so the VNNI peak stays the yardstick")
    return "\n".join(out) + "\n"


def as_json(p: Profile) -> dict:
    return {"model": p.model, "threads": p.threads, "pp": p.pp, "depth": p.depth, "chunk": p.chunk,
            "target": p.target, "isa": p.isa, "kernel_paths": p.kernel_paths,
            "seconds": p.seconds, "tok_s": p.pp / p.seconds,
            "peak": {"isa": p.peak.isa, "macs_per_s": p.peak.macs_per_s, "amx_macs_per_s": p.peak.amx_macs_per_s,
                     "exact_macs_per_s": p.peak.exact_macs_per_s}
            if p.peak else None,
            "int8_macs": p.int8_macs, "int8_seconds": p.int8_seconds,
            "kernels": [vars(k) for k in p.kernels]}
