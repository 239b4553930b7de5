"""ik_llama.cpp, the third engine of kiln's benchmarks, through its own tools: llama-bench for `kiln bench`,
llama-batched-bench for `kiln bench --batch`, llama-server for `kiln bench-serve`.

`make ik-llama` builds them natively from the vendor tree of the pinned ik-llama-cpp-python sdist into
build/ik-llama/bin/ (`make ik-llama-avx2`: the same for AVX2 alone, bin-avx2/, for --target x86-64-v3).
They run as processes, not bindings: ik's C API is not mainline's, and its tools are what its own
figures are measured with. ik is set at its best: flash attention on, fused MoE on a mixture of experts,
and run-time repack (-rtr, weights rearranged into its row-interleaved layouts at load) both off and on,
the faster counting, since which wins depends on the weight type and the test.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from ..core.errors import KilnError, OptionError

SDIST = "ik-llama-cpp-python 0.1.5"  # the sdist whose vendor/ik_llama.cpp `make ik-llama` builds (Makefile IK_LLAMA_PY)
REPACK = {"rtr off": False, "rtr on": True}  # the settings each test runs, by the name the tables show
ENV = "KILN_IK_LLAMA"
ROOT = Path(__file__).resolve().parents[2]


class IkError(KilnError):
    """An ik_llama.cpp tool failed or printed what its parser does not know."""


def default_bin_dir(target: str | None = None) -> Path:
    """Where `make ik-llama` puts the tools; for kiln's x86-64-v3 path, the AVX2 build beside it, so that
    each engine runs the same instruction set."""
    return ROOT / "build" / "ik-llama" / ("bin-avx2" if target == "x86-64-v3" else "bin")


def _runnable(p: Path) -> bool:
    return p.is_file() and os.access(p, os.X_OK)


def find(given: str | None, tool: str, target: str | None = None, option: str = "--ik", log=print) -> Path | None:
    """The ik tool to run, or None to go on without ik. given: a bin directory or one of its tools (an
    explicit path: an error naming `option` when it holds no `tool`), 'none', or None/'auto' for
    $KILN_IK_LLAMA (a bin directory) and then `make ik-llama`'s. A default that is missing is one line
    in the log, not an error: a machine without the build still compares kiln with llama.cpp."""
    if given == "none":
        return None
    if given not in (None, "auto"):
        p = Path(given).expanduser()
        at = p / tool if p.is_dir() else (p if p.name == tool else p.parent / tool) if p.is_file() else None
        if at is None or not _runnable(at):
            what = "no such file or directory" if at is None else f"no runnable {tool} at {at}"
            raise OptionError(f"{option} {given}: {what} (give ik_llama.cpp's bin directory, `make ik-llama` "
                              f"builds {default_bin_dir(target)}, or 'none')")
        return at
    env = os.environ.get(ENV)
    if env:
        at = Path(env).expanduser() / tool
        if not _runnable(at):
            raise OptionError(f"${ENV}={env}: no runnable {tool} at {at} (it names ik_llama.cpp's bin directory)")
        return at
    at = default_bin_dir(target) / tool
    if _runnable(at):
        return at
    make = "make ik-llama-avx2" if target == "x86-64-v3" else "make ik-llama"
    log(f"ik_llama.cpp: no {tool} at {at} (`{make}` builds it, about 15 minutes); going on without it")
    return None


def bench_kv(kv_dtype: str) -> str:
    """llama-bench's cache type for kiln's --kv-dtype. Its parser (ggml_type_from_name) knows no f32, so an
    f32 run gives ik an f16 cache, and the table says so."""
    return "f16" if kv_dtype == "f32" else kv_dtype


@dataclass
class Runner:
    """One ik tool, and every command line it ran (the JSON's provenance keeps them)."""
    binary: Path
    commands: dict[str, str] = field(default_factory=dict)
    build: dict = field(default_factory=dict)  # build_commit, build_number, as the binary reports them

    def run(self, key: str, argv: list[str], timeout: float = 3600) -> tuple[str, str]:
        """Run argv (argv[0] this tool) in a scratch directory (ik's common code may write llama.*.log
        into the working directory); its stdout and stderr, or IkError with the tail of what it said."""
        self.commands[key] = shlex.join(argv)
        with tempfile.TemporaryDirectory(prefix="kiln-ik-") as cwd:
            try:
                p = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout)
            except (OSError, subprocess.SubprocessError) as e:
                raise IkError(f"{argv[0]}: {e}") from None
        if p.returncode:
            tail = " | ".join((p.stderr or p.stdout).strip().splitlines()[-4:])
            raise IkError(f"{Path(argv[0]).name} exited with {p.returncode}: {tail}")
        return p.stdout, p.stderr

    def describe(self) -> dict:
        """What the JSON records of this engine: the sdist, the binary, its build info, the commands."""
        build = self.build or version(self.binary)  # llama-bench's come with its JSON; the others' from --version
        return {"sdist": SDIST, "binary": str(self.binary), **build, "commands": dict(self.commands)}


# --- llama-bench -------------------------------------------------------------------------------------------

def bench_argv(binary: Path | str, model: str | Path, n_prompt: int, n_gen: int, depth: int, threads: int,
               kv_dtype: str, repack: bool, moe: bool) -> list[str]:
    """One kiln bench test as one llama-bench process with one repetition (kiln's rounds alternate the
    engines; llama-bench's own warm-up is a 1-token prefill and decode, not counted). pp: -p N -n 0;
    tg: -p 0 -n N; tg at depth: -gp D,N, which prefills D tokens untimed and times N decodes after them
    (its TEST_KIND_GP restarts the clock after the prompt). -fa 1 and -fmoe 1 are ik's defaults, given
    all the same so that the command line says what ran."""
    if n_prompt and (n_gen or depth):
        raise IkError("llama-bench times a prompt from position 0 only: no pp at depth, no pp with tg")
    kv = bench_kv(kv_dtype)
    test = (["-p", "0", "-n", "0", "-gp", f"{depth},{n_gen}"] if depth else
            ["-p", str(n_prompt), "-n", "0"] if n_prompt else ["-p", "0", "-n", str(n_gen)])
    return [str(binary), "-m", str(model), *test, "-r", "1", "-o", "json", "-t", str(threads), "-fa", "1",
            "-ctk", kv, "-ctv", kv, "-rtr", str(int(repack)), *(["-fmoe", "1"] if moe else [])]


def parse_bench_json(text: str) -> list[dict]:
    """llama-bench -o json: one object a test, with build_commit, build_number, avg_ts (tok/s)..."""
    start = re.search(r"^\[", text, re.M)  # the printer's header; anything printed before it is not JSON
    try:
        rows = json.JSONDecoder().raw_decode(text, start.start())[0] if start else None
    except json.JSONDecodeError as e:
        raise IkError(f"llama-bench printed JSON that does not parse: {e}") from None
    if not isinstance(rows, list) or not rows or not all(isinstance(r, dict) and "avg_ts" in r for r in rows):
        raise IkError(f"llama-bench printed no test results: {text[:200]!r}")
    return rows


class BenchEngine:
    """ik_llama.cpp's llama-bench as a kiln bench engine: run(test) -> tok/s, one process a call."""

    def __init__(self, runner: Runner, model: str | Path, threads: int, kv_dtype: str, repack: bool, moe: bool):
        self.runner, self.model, self.threads, self.kv_dtype = runner, model, threads, kv_dtype
        self.repack, self.moe = repack, moe

    def run(self, t, tokens=None) -> float:
        """t: a BenchTest (name, n_prompt, n_gen, depth); ik draws its own random tokens."""
        argv = bench_argv(self.runner.binary, self.model, t.n_prompt, t.n_gen, t.depth, self.threads,
                          self.kv_dtype, self.repack, self.moe)
        rows = parse_bench_json(self.runner.run(f"{t.name} rtr {'on' if self.repack else 'off'}", argv)[0])
        self.runner.build = {k: rows[0][k] for k in ("build_commit", "build_number", "cpu_info") if k in rows[0]}
        return float(rows[0]["avg_ts"])


def bench_engines(runner: Runner, model, threads: int, kv_dtype: str, moe: bool) -> dict[str, BenchEngine]:
    """An engine for each repack setting, by the name its column has."""
    return {name: BenchEngine(runner, model, threads, kv_dtype, rtr, moe) for name, rtr in REPACK.items()}


# --- llama-batched-bench -----------------------------------------------------------------------------------

def batched_argv(binary: Path | str, model: str | Path, batches: list[int], depth: int, tg: int, threads: int,
                 kv_dtype: str, repack: bool, flash_attn: bool = True) -> list[str]:
    """B sequences, each prefilled with `depth` tokens of its own (no -pps: the prompt is not shared), then
    tg steps of one row a sequence; S_TG is the aggregate decode speed. Its options are common's, not
    llama-bench's: -fa takes on/off, -rtr is a bare switch (and turns mmap off), fused MoE is on unless
    -no-fmoe. -c fits the largest B."""
    ctx = max(batches) * (depth + tg) + 64
    return [str(binary), "-m", str(model), "-c", str(ctx), "-npp", str(depth), "-ntg", str(tg),
            "-npl", ",".join(map(str, batches)), "-t", str(threads), "-tb", str(threads),
            "-fa", "on" if flash_attn else "off", "-ctk", kv_dtype, "-ctv", kv_dtype, *(["-rtr"] if repack else [])]


MULTI_SEQ_FA = ("ik_llama.cpp's flash attention aborts when two sequences' prompts share a batch "
                "(GGML_ASSERT(S > 0) in iqk_fa_templates.h): ik ran with it off wherever it held more than one")


def probe_argv(batched_bench: Path | str, model: str | Path, threads: int) -> list[str]:
    return [str(batched_bench), "-m", str(model), "-c", "64", "-npp", "1", "-ntg", "1", "-npl", "2",
            "-t", str(threads), "-tb", str(threads), "-fa", "on"]


def multi_seq_flash_attn(batched_bench: Path | str, model: str | Path, threads: int) -> bool:
    """Whether ik's flash attention runs the prompts of two sequences in one batch, as batched decode and a
    server with two slots need. ik-llama-cpp-python 0.1.5's aborts on the first such batch (iqk's
    GGML_ASSERT(S > 0): seen with SmolLM2 and Gemma 3, with every KV type, rtr or not), in
    llama-batched-bench and in llama-server alike, while one sequence alone runs. A one-token probe
    (a second or so) says which, so that ik runs flash attention wherever its build can."""
    argv = probe_argv(batched_bench, model, threads)
    with tempfile.TemporaryDirectory(prefix="kiln-ik-") as cwd:
        try:
            return subprocess.run(argv, cwd=cwd, capture_output=True, timeout=600).returncode == 0
        except (OSError, subprocess.SubprocessError):
            return False


_ROW = re.compile(r"^\|\s*(\d+)\s*\|\s*(\d+)\s*\|\s*(\d+)\s*\|\s*(\d+)\s*\|" + r"\s*([\d.]+)\s*\|" * 6)


def parse_batched(text: str) -> dict[int, float]:
    """llama-batched-bench's table (| PP | TG | B | N_KV | T_PP s | S_PP t/s | T_TG s | S_TG t/s | T s | S t/s |):
    S_TG, the aggregate decode tok/s, by B."""
    out = {int(m[3]): float(m[8]) for m in map(_ROW.match, text.splitlines()) if m}
    if not out:
        raise IkError(f"llama-batched-bench printed no result rows: {text.strip()[-300:]!r}")
    return out


def batched_speeds(runner: Runner, model, batches: list[int], depth: int, tg: int, threads: int, kv_dtype: str,
                   repack: bool, key: str, flash_attn: bool = True) -> dict[int, float]:
    argv = batched_argv(runner.binary, model, batches, depth, tg, threads, kv_dtype, repack, flash_attn)
    got = parse_batched("\n".join(runner.run(key, argv)))  # its table goes to stderr (LOG_TEE)
    missing = [b for b in batches if b not in got]
    if missing:
        raise IkError(f"llama-batched-bench gave no row for B={missing}")
    return got


# --- llama-server ------------------------------------------------------------------------------------------

def server_argv(binary: Path | str, model: str | Path, alias: str, port: int, n_seq: int, ctx: int, threads: int,
                kv_dtype: str, repack: bool = False, flash_attn: bool = True) -> list[str]:
    """ik's llama-server beside mainline's, with the same workload settings. Its flags are mainline's but two:
    no --no-webui (ik's is --webui none) and -rtr a bare switch; flash attention is on by default, given."""
    return [str(binary), "-m", str(model), "--alias", alias, "--port", str(port), "--parallel", str(n_seq),
            "--cont-batching", "-c", str(ctx * n_seq), "-t", str(threads), "-tb", str(threads),
            "-ctk", kv_dtype, "-ctv", kv_dtype, "-fa", "on" if flash_attn else "off", "--webui", "none",
            *(["-rtr"] if repack else [])]


def version(binary: Path | str) -> dict:
    """A common-based tool's `--version` ("version: N (COMMIT)") as build_number and build_commit. The
    sdist's tree has no .git: `make ik-llama` writes the sdist's name as the commit (Makefile IK_BUILD_INFO)."""
    try:
        p = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return {}
    m = re.search(r"version: (\d+) \(([^)\s]+)\)", p.stdout + p.stderr)
    return {"build_number": int(m[1]), "build_commit": m[2]} if m else {}
