"""The C runtime (runtime_c/*.c), built once per target and flags into a static library that
every model's extension links: a new model or option set compiles only its own model.c.

The runtime's own cffi module (its kernels alone) serves the kernel tests and the packer; loading
it checks that Python's table of element types agrees with the C one (core/dtypes.py).
"""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType

from ..core.dtypes import check_against_runtime
from ..core.paths import RUNTIME_DIR
from ..core.progress import as_progress
from .cc import build_key, cached_build, header_cdef, run
from .extension import Extension, load_extension
from .targets import ar, cc, compile_args, target_identity


def runtime_sources() -> tuple[Path, ...]:
    return tuple(sorted(RUNTIME_DIR.glob("*.c")))


def runtime_library(sanitize: bool = False, target: str = "native", log=lambda s: None,
                    isa: tuple[str, ...] = ()) -> tuple[Path, bool]:
    """libkiln_runtime.a for these flags, compiled (file by file, in parallel) if it is not cached;
    and whether it was cached."""
    flags = compile_args(sanitize, target, isa)
    sources = runtime_sources()
    compiler = cc(target)
    key = build_key(("runtime", target_identity(sanitize, target, isa), repr(flags)),
                    (*sources, *sorted(RUNTIME_DIR.glob("*.h"))), compiler)
    progress = as_progress(log)

    def build(out: Path) -> None:
        progress.work(f"cc the runtime for {target}: {len(sources)} C files, {' '.join(flags)}")
        objects = [out / f"{s.stem}.o" for s in sources]
        with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
            list(pool.map(lambda so: run(compiler + flags + [f"-I{RUNTIME_DIR}", "-c", str(so[0]), "-o", str(so[1])],
                                         f"compiling {so[0].name}"), zip(sources, objects)))
        run([ar(target), "rcs", str(out / "libkiln_runtime.a"), *map(str, objects)], "archiving the runtime")
        for o in objects:
            o.unlink()

    return cached_build(f"runtime_{key}", "libkiln_runtime.a", build)


def kernels_cdef() -> str:
    return "\n".join(header_cdef(RUNTIME_DIR / h) for h in ("constants.h", "kernels.h", "isa.h"))


def runtime_kernels(sanitize: bool = False, log=lambda s: None, target: str = "native",
                    isa: tuple[str, ...] = ()) -> ModuleType:
    """The runtime's kernels alone, for kernel tests and the packer; and what paths the library
    holds (build/targets.py kernels_reported)."""
    lib, _ = runtime_library(sanitize, target, log, isa)
    module = load_extension(Extension("runtime", kernels_cdef(), '#include "kernels.h"\n#include "isa.h"',
                                      libraries=(lib,), sanitize=sanitize, target=target, isa=isa), log)
    check_against_runtime(module.ffi, module.lib)
    return module
