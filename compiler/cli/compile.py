"""kiln compile: generate the C, build the library (cached), and copy it out with -o."""
from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from ..build.kernel_report import weight_kernels
from ..build.targets import cc, cross
from ..core.errors import KilnError
from ..core.paths import RUNTIME_DIR
from ..driver import API_HEADERS, compile_c_library, compile_model
from ..planner.reports.text import render_text
from .common import add_build_options, add_model_options, add_threads, log, options, progress


def run(a: argparse.Namespace) -> None:
    if a.c_lib and not a.output:
        raise KilnError("--c-lib writes a directory: give it with -o DIR")
    with progress(every_stage=True) as p:
        if not a.c_lib and cross(a.target):
            raise KilnError(f"--target {a.target} is another architecture than this CPU's: it can only be built "
                            "as a C library (add --c-lib -o DIR)")
        c = compile_model(a.model, options(a), log=p, target=a.target, isa=a.isa)
        lib = Path(c.module.__file__) if c.module else None
        if a.c_lib:  # the same C, built by cc alone: no cffi, no Python
            with p.stage("cc -shared"):
                lib = compile_c_library(c, p)
                p.note(str(lib))
    ext = c.extension
    lines = weight_kernels(c.planned.spec, c.planned.graph, ext.sanitize, ext.target, ext.isa, log)
    log(f"weights by type, and the kernel each runs on ({ext.target}{''.join(f' {n}' for n in ext.isa)}):")
    for line in lines:
        log(f"  {line}")
    if not a.output:
        print(lib)
        return
    out = Path(a.output)
    out.mkdir(parents=True, exist_ok=True)
    texts = {"model.c": c.model_c, "layout.txt": render_text(c.planned.layout)}
    copies = [lib] + ([c.packed_path] if c.packed_path else [])  # kiln_open(..., packed_path, ...) maps it
    if a.c_lib:
        copies += list(API_HEADERS)  # model.h and the status.h it includes
        texts["examples/c/generate.c"] = (RUNTIME_DIR / "examples" / "generate.c").read_text()
    for name, text in texts.items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_text(text)
    for path in copies:
        shutil.copy2(path, out / path.name)
    print(f"{out}: {', '.join([*texts, *(p.name for p in copies)])}")
    if a.c_lib:
        packed = c.packed_path.name if c.packed_path else "-"
        print(f"build the example:  cd {out} && {' '.join(cc(a.target))} -O2 -I. examples/c/generate.c -L. -lkiln_model "
              f"-Wl,-rpath,'$ORIGIN' -o generate\n"
              f"run it:             kiln tokenize {a.model} -p 'Once upon a time' > prompt.ids && "
              f"./generate {c.planned.spec.path} prompt.ids 32 {packed} | kiln detokenize {a.model}")


def register(sub) -> None:
    p = sub.add_parser("compile", help="generate C, build the shared library (cached), optionally copy it out",
                       epilog="docs: docs/architecture.md (the pipeline), docs/c-library.md (--c-lib)")
    add_model_options(p)
    add_build_options(p)
    p.add_argument("-o", "--output", help="directory to keep model.c, the layout map and the library")
    p.add_argument("--c-lib", action="store_true",
                   help="build a plain C library instead of the Python extension: -o DIR gets libkiln_model.so, "
                        "model.h, status.h and examples/c/generate.c")
    add_threads(p, "accepted for scripts; threads are chosen when the library is loaded (kiln run --threads)")
    p.set_defaults(run=run)
