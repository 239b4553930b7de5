"""C built into Python extensions with cffi, and into plain shared libraries; both cached.

An extension is a cffi module over a few C files and, for the models and the kernel tests, the
runtime library (runtime.py): only its own files are compiled, the runtime is linked.
"""
from __future__ import annotations

import importlib.machinery
import importlib.util
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from ..core.errors import BuildError
from ..core.paths import RUNTIME_DIR
from ..core.progress import as_progress
from .cc import build_key, cached_build, header_cdef, run
from .targets import cc, check_runs_here, compile_args, link_args, target_identity


@dataclass(frozen=True)
class Extension:
    """A C extension to build: its exported declarations and the files that make it."""

    name: str  # module prefix, e.g. "runtime" or "model"
    cdef: str  # declarations cffi exposes to Python
    prelude: str  # C text of the cffi wrapper (usually #includes)
    sources: tuple[Path, ...] = ()
    include_dirs: tuple[Path, ...] = ()
    libraries: tuple[Path, ...] = ()  # static libraries linked in (the runtime's)
    sanitize: bool = False
    defines: tuple[str, ...] = ()  # -D macros, e.g. KILN_PROFILE
    target: str = "native"  # the CPU it is built for (targets.TARGETS)
    isa: tuple[str, ...] = ()  # extensions of the target left out (targets.ISA_OFF)

    def flags(self) -> list[str]:
        return compile_args(self.sanitize, self.target, self.isa) + [f"-D{d}" for d in self.defines]

    def key(self, *more: str) -> str:
        return build_key((target_identity(self.sanitize, self.target, self.isa), self.cdef, self.prelude,
                          repr(self.flags()), *(p.name for p in self.libraries), *more),
                         (*self.sources, *sorted(RUNTIME_DIR.glob("*.h")), *self.libraries), cc(self.target))


def load_extension(ext: Extension, log=lambda s: None) -> ModuleType:
    """Build (or reuse) the extension and import it; refused where this CPU cannot run its target."""
    check_runs_here(ext.target)
    modname = f"_kiln_{ext.name}_{ext.key()}"
    if modname in sys.modules:
        return sys.modules[modname]
    progress = as_progress(log)
    lib, cached = cached_build(modname, f"{modname}*.so", lambda out: _compile(ext, modname, out, progress))
    if cached:
        progress.note(f"cached: {modname}")
    spec = importlib.util.spec_from_file_location(modname, lib,
                                                  loader=importlib.machinery.ExtensionFileLoader(modname, str(lib)))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules[modname] = module
    return module


def _compile(ext: Extension, modname: str, out: Path, log) -> None:
    import cffi  # only needed when something must be compiled

    ffi = cffi.FFI()
    ffi.cdef(ext.cdef)
    ffi.set_source(modname, ext.prelude, sources=[str(s) for s in ext.sources],
                   include_dirs=[str(d) for d in (*ext.include_dirs, RUNTIME_DIR)], extra_compile_args=ext.flags(),
                   extra_objects=[str(p) for p in ext.libraries], extra_link_args=link_args(ext.sanitize))
    log.work(f"compiling {modname}: {', '.join(s.name for s in ext.sources) or 'the cffi wrapper'} for {ext.target}"
             + (f", linking {', '.join(p.name for p in ext.libraries)}" if ext.libraries else ""))
    try:
        built = Path(ffi.compile(tmpdir=str(out.parent / f"cffi-{out.parent.name}"), verbose=False))
    except Exception as e:  # distutils/setuptools raise several unrelated types
        raise BuildError(f"building {ext.name} failed: {e}") from None
    shutil.copy2(built, out / built.name)


def build_c_library(ext: Extension, api_headers: tuple[Path, ...], log=lambda s: None) -> Path:
    """The extension's C as a plain shared library, libkiln_<name>.so, cached like the extension: no
    cffi, no Python, built by the system C compiler. Only the functions the API headers declare are
    exported; the runtime's kernels stay internal, so they cannot clash with a program's own symbols.
    It may be for a target this CPU cannot run."""
    declarations = (re.sub(r"/\*.*?\*/", "", header_cdef(h), flags=re.S) for h in api_headers)
    api = sorted({name for text in declarations for name in re.findall(r"\b(kiln_\w+)\s*\(", text)})
    filename = f"libkiln_{ext.name}.so"

    def compile_into(out: Path) -> None:
        script = out / "exports.map"
        script.write_text("{\n  global:\n" + "".join(f"    {n};\n" for n in api) + "  local: *;\n};\n")
        includes = [f"-I{d}" for d in (*ext.include_dirs, RUNTIME_DIR)]
        as_progress(log).work(f"cc -shared {filename}")
        # --undefined pulls every API function out of the runtime archive, even one no model code calls
        run(cc(ext.target) + ext.flags() + ["-shared", *includes, *map(str, ext.sources),
                                  *(f"-Wl,--undefined={n}" for n in api), *map(str, ext.libraries),
                                  f"-Wl,--version-script={script}", *link_args(ext.sanitize), "-o",
                                  str(out / filename)], f"building {filename}")

    key = ext.key("shared-library", *api)
    return cached_build(f"libkiln_{ext.name}_{key}", filename, compile_into)[0]
