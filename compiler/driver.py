"""Make a model ready to run: plan -> generate -> build -> pack, each stage cached.

The runtime is built once per target and flags (build/runtime.py); a model compiles only its own
model.c and links it. `compile_model` returns everything the runtime layer needs to open it.
"""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from .build.cc import header_cdef, preprocessed_cdef
from .build.extension import Extension, build_c_library, load_extension
from .build.packing import packed_file
from .build.runtime import runtime_library
from .build.targets import check_target, cross, isa_switch, kernel_set
from .codegen.render import generate
from .core.files import write_atomically
from .core.options import CompileOptions
from .core.paths import RUNTIME_DIR, cache_dir
from .core.progress import as_progress
from .frontend.registry import resolve
from .planner.plan import Planned, plan

API_HEADERS = (RUNTIME_DIR / "status.h", RUNTIME_DIR / "model.h")  # what a model's library exports


@dataclass(frozen=True)
class Compiled:
    planned: Planned
    model_c: str
    source_dir: Path  # holds model.c
    extension: Extension  # what the module was built from; build_c_library builds the same C without Python
    module: ModuleType | None  # None for a target of another architecture: only a C library can be built
    packed_path: Path | None  # the packed weights file the library reads into memory; None: every weight from the GGUF


def model_extension(source_dir: Path, runtime: Path, sanitize: bool, target: str, profile: bool,
                    isa: tuple[str, ...] = ()) -> Extension:
    cdef = preprocessed_cdef(RUNTIME_DIR / "status.h") + "\n" + header_cdef(RUNTIME_DIR / "model.h")
    return Extension("model", cdef, '#include "model.h"', (source_dir / "model.c",), (source_dir,), (runtime,),
                     sanitize, ("KILN_PROFILE",) if profile else (), target, isa)


def compile_model(model: str | os.PathLike[str], opts: CompileOptions, sanitize: bool = False,
                  log=lambda s: None, profile: bool = False, target: str = "native",
                  isa: str | None = None) -> Compiled:
    """Plan, generate, build and pack `model`. `log` is a message callable or a core.progress.Progress,
    which then shows the stages. `profile` builds the library that times every op (Model.op_seconds).
    `isa` leaves extensions of the target out ("no-amx,no-avx512"; default $KILN_ISA). A target of
    another architecture is generated and its runtime built, but nothing is loaded or packed."""
    check_target(target)
    isa_off = isa_switch(isa)
    p = as_progress(log)
    with p.stage("fetch"):
        path = resolve(model, p)
    with p.stage("plan"):
        planned = plan(path, opts, p)
        lay = planned.layout
        p.note(f"{len(planned.graph.nodes)} ops (a body of {len(planned.graph.body)} for each of "
               f"{len(planned.graph.layers)} layers), arena {lay.activation_bytes:,} bytes, "
               f"KV pool {lay.kv.total_bytes:,} bytes")
    with p.stage("generate"):
        model_c = generate(planned)
        source_dir = cache_dir() / "src" / hashlib.sha256(model_c.encode()).hexdigest()[:24]
        if not (source_dir / "model.c").is_file():
            write_atomically(source_dir / "model.c", model_c.encode())
        p.note(f"model.c {model_c.count(chr(10)):,} lines in {source_dir}")
    with p.stage("cc"):
        runtime, runtime_cached = runtime_library(sanitize, target, p, isa_off)
        ext = model_extension(source_dir, runtime, sanitize, target, profile, isa_off)
        module = None if cross(target) else load_extension(ext, p)
        built_for = target + "".join(f" {name}" for name in isa_off)
        p.also(f"kernels for {built_for}: {kernel_set(sanitize, target, isa_off)}")
        if runtime_cached:  # only model.c was compiled, if anything
            p.also(f"the runtime for {built_for} was cached")
    if module is None:
        return Compiled(planned, model_c, source_dir, ext, None, None)
    with p.stage("pack"):
        packed = packed_file(planned.spec, lay.packed, bool(module.lib.kiln_x8_kernels()), p)
    return Compiled(planned, model_c, source_dir, ext, module, packed)


def compile_c_library(c: Compiled, log=lambda s: None) -> Path:
    """The compiled model's C as a plain shared library (kiln compile --c-lib)."""
    return build_c_library(c.extension, API_HEADERS, log)
