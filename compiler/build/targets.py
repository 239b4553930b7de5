"""The CPUs a build can be for, and the flags that say so.

A target is this CPU (`native`), an x86-64 level (-march's names), an x86 feature set kiln has
kernels for (`avx512-vnni`, `amx`), or an ARM one (`aarch64`, `+dotprod`, `+i8mm`). Each names the
features a CPU needs to run it, in the words of archspec's database of microarchitectures, which
also tells what this CPU has. Every target computes the same bits (runtime_c/vec_f32.h), so they
differ in speed only. The target is part of every build key, through the instruction set the flags
select (the compiler's predefined macros): a cache shared between hosts never hands one CPU's
native build to another.

An ISA switch (`--isa no-amx,no-avx512`, or $KILN_ISA) builds a target without some of its
extensions, so that every path can be measured and tested on one machine.

A target of another architecture than this CPU's is built with the cross compiler
(aarch64-linux-gnu-gcc, or $KILN_CC_AARCH64): it can be a plain C library (`kiln compile --c-lib`)
but never loaded here.
"""
from __future__ import annotations

import os
import platform
import shutil
import subprocess
from dataclasses import dataclass
from functools import lru_cache

from ..core.errors import BuildError
from . import cc as host


@dataclass(frozen=True)
class Target:
    name: str
    family: str  # the architecture: x86_64 or aarch64
    march: tuple[str, ...]  # the compiler flags that name the CPU
    base: str | None  # archspec's microarchitecture whose features a CPU needs (None: this CPU's own)
    extra: frozenset[str] = frozenset()  # features beyond the base's (archspec's /proc/cpuinfo names)


_X86_V4 = ("-march=x86-64-v4",)
TARGETS: dict[str, Target] = {t.name: t for t in (
    Target("native", "", ("-march=native",), None),
    Target("x86-64", "x86_64", ("-march=x86-64",), "x86_64"),
    Target("x86-64-v2", "x86_64", ("-march=x86-64-v2",), "x86_64_v2"),
    Target("x86-64-v3", "x86_64", ("-march=x86-64-v3",), "x86_64_v3"),
    Target("x86-64-v4", "x86_64", _X86_V4, "x86_64_v4"),
    Target("avx512-vnni", "x86_64", _X86_V4 + ("-mavx512vnni",), "x86_64_v4", frozenset({"avx512_vnni"})),
    Target("amx", "x86_64", _X86_V4 + ("-mavx512vnni", "-mamx-tile", "-mamx-int8"), "x86_64_v4",
           frozenset({"avx512_vnni", "amx_tile", "amx_int8"})),
    Target("aarch64", "aarch64", ("-march=armv8-a",), "aarch64", frozenset({"asimd"})),
    Target("aarch64+dotprod", "aarch64", ("-march=armv8.2-a+dotprod",), "aarch64", frozenset({"asimd", "asimddp"})),
    Target("aarch64+dotprod+i8mm", "aarch64", ("-march=armv8.2-a+dotprod+i8mm",), "aarch64",
           frozenset({"asimd", "asimddp", "i8mm"})),
)}

# --isa: extensions a build leaves out, each as the flags that turn it off
ISA_OFF: dict[str, tuple[str, ...]] = {
    "no-amx": ("-mno-amx-tile", "-mno-amx-int8", "-mno-amx-bf16"),
    "no-vnni": ("-mno-avx512vnni", "-mno-avxvnni"),
    "no-vbmi": ("-mno-avx512vbmi",),
    "no-avx512": ("-mno-avx512f",),  # every AVX-512 subset goes with it: AVX2 is the widest left
    "no-dotprod": ("-march=armv8-a",),  # on aarch64 the plain architecture, last -march winning
}


def check_target(target: str) -> None:
    if target not in TARGETS:
        raise BuildError(f"unknown target {target!r}; choose one of {', '.join(TARGETS)}")


def isa_switch(isa: str | None = None) -> tuple[str, ...]:
    """The extensions --isa (or $KILN_ISA) leaves out, checked and in a fixed order."""
    text = isa if isa is not None else os.environ.get("KILN_ISA", "")
    names = {n.strip() for n in text.split(",") if n.strip()}
    unknown = names - set(ISA_OFF)
    if unknown:
        raise BuildError(f"--isa / KILN_ISA: unknown {', '.join(sorted(unknown))}; choose from {', '.join(ISA_OFF)}")
    return tuple(n for n in ISA_OFF if n in names)


def family(target: str) -> str:
    check_target(target)
    return TARGETS[target].family or host_family()


def host_family() -> str:
    machine = platform.machine().lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(machine, machine)


def cross(target: str) -> bool:
    """Whether the target is another architecture than this CPU's (built by a cross compiler)."""
    return family(target) != host_family()


def cc(target: str = "native") -> list[str]:
    """The C compiler for the target: $CC (or Python's) for this CPU's architecture, the cross
    compiler for another."""
    if not cross(target):
        return host.cc()
    fam = family(target)
    named = os.environ.get(f"KILN_CC_{fam.upper()}") or f"{fam}-linux-gnu-gcc"
    if shutil.which(named.split()[0]) is None:
        raise BuildError(f"target {target} needs the {fam} cross compiler '{named}', which is not on PATH; install "
                         f"it (Debian: apt-get install gcc-{fam.replace('_', '-')}-linux-gnu) or name it in "
                         f"$KILN_CC_{fam.upper()}")
    return named.split()


def ar(target: str = "native") -> str:
    """The archiver that writes the target's static library index."""
    if not cross(target):
        return "ar"
    return cc(target)[0].rsplit("-", 1)[0] + "-ar"  # aarch64-linux-gnu-gcc -> aarch64-linux-gnu-ar


def compile_args(sanitize: bool, target: str = "native", isa: tuple[str, ...] = ()) -> list[str]:
    check_target(target)
    # -ffp-contract=off: the compiler fuses no multiply-add on its own; the kernels fuse where their
    # definition says so, so that every target rounds alike
    args = ["-std=gnu11", "-fno-math-errno", "-ffp-contract=off", "-Wall", "-Wno-unused-function", "-fPIC",
            *TARGETS[target].march, *(f for name in isa for f in ISA_OFF[name] if _applies(name, target))]
    if sanitize:  # the same -march, so that the sanitizers run the SIMD kernels the real build runs
        return args + ["-O1", "-g", "-fno-omit-frame-pointer", "-fsanitize=address,undefined",
                       "-fno-sanitize-recover=undefined"]
    return args + ["-O3"]


def _applies(isa_name: str, target: str) -> bool:
    return (isa_name == "no-dotprod") == (family(target) == "aarch64")


def link_args(sanitize: bool) -> list[str]:
    return ["-pthread", "-lm"] + (["-fsanitize=address,undefined"] if sanitize else [])


@lru_cache(maxsize=32)
def target_identity(sanitize: bool, target: str = "native", isa: tuple[str, ...] = ()) -> str:
    """What the flags compile for on this machine: the predefined macros (the ISA extensions -march
    turns on among them), sorted."""
    compiler = cc(target)
    try:
        out = subprocess.run(compiler + compile_args(sanitize, target, isa) + ["-E", "-dM", "-x", "c", os.devnull],
                             capture_output=True, text=True)
    except OSError:
        raise BuildError(f"no C compiler: '{' '.join(compiler)}' cannot be run; install gcc (apt-get install gcc)") from None
    if out.returncode != 0:
        raise BuildError(f"the C compiler rejects kiln's flags {compile_args(sanitize, target, isa)}: "
                         f"{out.stderr.strip()[:500]}")
    return "\n".join(sorted(out.stdout.splitlines()))


def kernel_set(sanitize: bool, target: str = "native", isa: tuple[str, ...] = ()) -> str:
    """Which kernels a build runs, in words."""
    return describe_kernels(kernel_macros(sanitize, target, isa))


def kernel_macros(sanitize: bool, target: str = "native", isa: tuple[str, ...] = ()) -> tuple[str, ...]:
    """runtime_c/isa.h's KILN_HAVE_* macros, as the target's flags preprocess them (so even a build
    this CPU cannot load says)."""
    from ..core.paths import RUNTIME_DIR

    done = subprocess.run(cc(target) + compile_args(sanitize, target, isa) + ["-E", "-dM", str(RUNTIME_DIR / "isa.h")],
                          capture_output=True, text=True)
    return tuple(line.split()[1] for line in done.stdout.splitlines() if line.startswith("#define KILN_HAVE_"))


def kernels_reported(runtime) -> tuple[str, ...]:
    """The KILN_HAVE_* paths a loaded runtime (build/runtime.py runtime_kernels) says its objects
    were compiled with (isa.c): kernel_set's answer, unless the library was built with other flags."""
    return tuple(runtime.ffi.string(runtime.lib.kiln_kernel_paths()).decode().split())


def describe_kernels(macros) -> str:
    have = set(macros)
    return ", ".join(what for macro, what in KERNEL_PATHS if macro in have) or "the scalar references"


# isa.h's macros, and what each adds to a build
KERNEL_PATHS = (
    ("KILN_HAVE_AVX2", "AVX2 on the GGUF layout"),
    ("KILN_HAVE_AVX512", "AVX-512 in attention"),
    ("KILN_HAVE_X8_AVX2", "AVX2 on the x8 layout"),
    ("KILN_HAVE_VNNI", "AVX-512 VNNI on the x8 layout"),
    ("KILN_HAVE_AMX", "AMX tiles in prefill"),
    ("KILN_HAVE_VBMI", "AVX-512 VBMI grid lookups"),
    ("KILN_HAVE_NEON", "NEON"),
    ("KILN_HAVE_DOTPROD", "sdot"),
    ("KILN_HAVE_I8MM", "smmla tiles"),
)


def missing_features(target: str) -> list[str]:
    """What a build for `target` needs that this CPU lacks (none for native): its library would
    die of an illegal instruction here."""
    check_target(target)
    t = TARGETS[target]
    if t.base is None:
        return []
    if cross(target):
        return [f"the {t.family} architecture (this CPU is {host_family()})"]
    return sorted(target_features(target) - host_features())


def target_features(target: str) -> frozenset[str]:
    """The CPU features a target stands for, in archspec's words: its base's and its extras, or
    this CPU's for native."""
    check_target(target)
    t = TARGETS[target]
    if t.base is None:
        return host_features()
    import archspec.cpu

    return frozenset(archspec.cpu.TARGETS[t.base].features | t.extra)


def host_features() -> frozenset[str]:
    import archspec.cpu

    return frozenset(archspec.cpu.detect.detected_info().features)


def check_runs_here(target: str) -> None:
    missing = missing_features(target)
    if missing:
        raise BuildError(f"a build for target {target} needs {', '.join(missing)}, which this CPU lacks; "
                         "load it for native or a lower target (--target)")
