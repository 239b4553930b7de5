"""C built into Python extensions with cffi, and into plain shared libraries; both cached.

An extension is a cffi module over a few C files and, for the models and the kernel tests, the
runtime library (runtime.py): only its own files are compiled, the runtime is linked.
"""
from __future__ import annotations

import contextlib
import importlib.machinery
import importlib.util
import io
import re
import sys
import sysconfig
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
    # Every extension of a kind shares one cffi wrapper, so each is named as its wrapper names it
    # (PyInit__kiln_model); a path of its own keeps them apart, and sys.modules holds it by key.
    spec = importlib.util.spec_from_file_location(
        _init_name(ext), lib, loader=importlib.machinery.ExtensionFileLoader(_init_name(ext), str(lib)))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules[modname] = module
    return module


def _init_name(ext: Extension) -> str:
    return f"_kiln_{ext.name}"


def _wrapper(ext: Extension, log) -> Path:
    """cffi's C for this kind of extension (its declarations and prelude), compiled once per flags
    and headers: the Python.h-heavy part, the same for every model, so that a new model compiles
    only its own C. Keyed by the headers' contents, not the folders' paths (a model's own folder
    holds no header)."""
    headers = sorted(h for d in (*ext.include_dirs, RUNTIME_DIR) for h in Path(d).glob("*.h"))
    key = build_key(("cffi-wrapper", target_identity(ext.sanitize, ext.target, ext.isa), ext.name, ext.cdef,
                     ext.prelude, repr(ext.flags())), headers, cc(ext.target))

    def build(out: Path) -> None:
        import cffi  # only needed when something must be compiled

        ffi = cffi.FFI()
        ffi.cdef(ext.cdef)
        ffi.set_source(_init_name(ext), ext.prelude)
        source = out / "wrapper.c"
        with contextlib.redirect_stdout(io.StringIO()):  # cffi says "generating ..." on stdout
            ffi.emit_c_code(str(source))
        log.work(f"compiling the cffi wrapper of the {ext.name} extensions for {ext.target}")
        run(cc(ext.target) + ext.flags() + [*_includes(ext), f"-I{sysconfig.get_paths()['include']}", "-c",
                                            str(source), "-o", str(out / "wrapper.o")], f"compiling {ext.name}'s cffi wrapper")
        source.unlink()

    return cached_build(f"cffi_{ext.name}_{key}", "wrapper.o", build)[0]


def _includes(ext: Extension) -> list[str]:
    return [f"-I{d}" for d in (*ext.include_dirs, RUNTIME_DIR)]


def _compile(ext: Extension, modname: str, out: Path, log) -> None:
    """The extension's own C compiled, then linked with its kind's wrapper and the runtime library:
    one compiler call, no setuptools."""
    wrapper = _wrapper(ext, log)
    log.work(f"compiling {modname}: {', '.join(s.name for s in ext.sources) or 'nothing of its own'} for {ext.target}"
             + (f", linking {', '.join(p.name for p in ext.libraries)}" if ext.libraries else ""))
    built = out / f"{modname}{importlib.machinery.EXTENSION_SUFFIXES[0]}"
    run(cc(ext.target) + ext.flags() + ["-shared", *_includes(ext), *map(str, ext.sources), str(wrapper),
                                        *map(str, ext.libraries), *link_args(ext.sanitize), "-o", str(built)],
        f"building {ext.name}")


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
