"""The CPUs a build can be for, and the flags that say so.

A target is this CPU (`native`) or an x86-64 level (-march's names), each with its name in
archspec's database of microarchitectures, which knows what features it needs. Every target
computes the same bits (runtime_c/vec_f32.h), so they differ in speed only. The target is part
of every build key, through the instruction set the flags select (the compiler's predefined
macros): a cache shared between hosts never hands one CPU's native build to another.
"""
from __future__ import annotations

import os
import subprocess
from functools import lru_cache

from ..core.errors import BuildError
from .cc import cc

TARGETS = {"native": None, "x86-64": "x86_64", "x86-64-v2": "x86_64_v2", "x86-64-v3": "x86_64_v3",
           "x86-64-v4": "x86_64_v4"}


def check_target(target: str) -> None:
    if target not in TARGETS:
        raise BuildError(f"unknown target {target!r}; choose one of {', '.join(TARGETS)}")


def compile_args(sanitize: bool, target: str = "native") -> list[str]:
    check_target(target)
    # -ffp-contract=off: the compiler fuses no multiply-add on its own; the kernels fuse where their
    # definition says so, so that every target rounds alike
    args = ["-std=gnu11", "-fno-math-errno", "-ffp-contract=off", "-Wall", "-Wno-unused-function", "-fPIC",
            f"-march={target}"]
    if sanitize:  # the same -march, so that the sanitizers run the SIMD kernels the real build runs
        return args + ["-O1", "-g", "-fno-omit-frame-pointer", "-fsanitize=address,undefined",
                       "-fno-sanitize-recover=undefined"]
    return args + ["-O3"]


def link_args(sanitize: bool) -> list[str]:
    return ["-pthread", "-lm"] + (["-fsanitize=address,undefined"] if sanitize else [])


@lru_cache(maxsize=16)
def target_identity(sanitize: bool, target: str = "native") -> str:
    """What the flags compile for on this machine: the predefined macros (the ISA extensions -march
    turns on among them), sorted."""
    try:
        out = subprocess.run(cc() + compile_args(sanitize, target) + ["-E", "-dM", "-x", "c", os.devnull],
                             capture_output=True, text=True)
    except OSError:
        raise BuildError(f"no C compiler: '{' '.join(cc())}' cannot be run; install gcc (apt-get install gcc)") from None
    if out.returncode != 0:
        raise BuildError(f"the C compiler rejects kiln's flags {compile_args(sanitize, target)}: "
                         f"{out.stderr.strip()[:500]}")
    return "\n".join(sorted(out.stdout.splitlines()))


def missing_features(target: str) -> list[str]:
    """What a build for `target` needs that this CPU lacks (none for native): its library would
    die of an illegal instruction here."""
    check_target(target)
    if TARGETS[target] is None:
        return []
    import archspec.cpu

    host, want = archspec.cpu.host(), archspec.cpu.TARGETS[TARGETS[target]]
    if want.family != host.family:
        return [f"the {want.family.name} architecture (this CPU is {host.family.name})"]
    return sorted(want.features - host.features)


def check_runs_here(target: str) -> None:
    missing = missing_features(target)
    if missing:
        raise BuildError(f"a build for target {target} needs {', '.join(missing)}, which this CPU lacks; "
                         "load it for native or a lower target (--target)")
