"""Build C into a Python extension with cffi, cached in $KILN_CACHE/build by a content hash.

The key covers everything that changes the binary: the C sources and headers, the cdef,
the compiler flags and version, kiln's version, and the instruction set the flags select on
this machine (`-march=native`: the compiler's predefined macros, __AVX512F__ and the like). A
cache shared between hosts (an NFS home, a container image) therefore never hands a library
built for one CPU to another: the other CPU's key differs and it builds its own. A second load
with the same key imports the cached library without compiling.
"""
from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from types import ModuleType

from ..core.version import __version__
from ..core.errors import KilnError
from ..core.progress import as_progress
from ..core.paths import RUNTIME_DIR, cache_dir



class BuildError(KilnError):
    """The C compiler failed or is missing."""


@dataclass(frozen=True)
class CSource:
    """A C extension to build: its exported declarations and the files that make it."""

    name: str  # module prefix, e.g. "runtime" or "model"
    cdef: str  # declarations cffi exposes to Python
    prelude: str  # C text of the cffi wrapper (usually #includes)
    sources: tuple[Path, ...]
    include_dirs: tuple[Path, ...] = ()
    sanitize: bool = False
    defines: tuple[str, ...] = ()  # -D macros, e.g. KILN_PROFILE
    target: str = "native"  # the CPU it is built for: one of TARGETS


def runtime_sources() -> tuple[Path, ...]:
    return tuple(sorted(RUNTIME_DIR.glob("*.c")))


def runtime_headers() -> tuple[Path, ...]:
    return tuple(sorted(RUNTIME_DIR.glob("*.h")))


# The CPUs a build can be for: this one, or an x86-64 level (-march's names), each with its name in
# archspec's database of microarchitectures, which knows what features it needs. Every target
# computes the same bits (runtime_c/vec_f32.h), so they differ in speed only.
TARGETS = {"native": None, "x86-64": "x86_64", "x86-64-v2": "x86_64_v2", "x86-64-v3": "x86_64_v3",
           "x86-64-v4": "x86_64_v4"}


def missing_features(target: str) -> list[str]:
    """What a build for `target` needs that this CPU lacks (none for native): its library would
    die of an illegal instruction here."""
    if target not in TARGETS:
        raise BuildError(f"unknown target {target!r}; choose one of {', '.join(TARGETS)}")
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


def compile_args(sanitize: bool, target: str = "native") -> list[str]:
    if target not in TARGETS:
        raise BuildError(f"unknown target {target!r}; choose one of {', '.join(TARGETS)}")
    # -ffp-contract=off: the compiler fuses no multiply-add on its own; the kernels fuse where their
    # definition says so, so that every target rounds alike
    args = ["-std=gnu11", "-fno-math-errno", "-ffp-contract=off", "-Wall", "-Wno-unused-function", f"-march={target}"]
    if sanitize:  # the same -march, so that the sanitizers run the SIMD kernels the real build runs
        return args + ["-O1", "-g", "-fno-omit-frame-pointer", "-fsanitize=address,undefined",
                       "-fno-sanitize-recover=undefined"]
    return args + ["-O3"]


def _cc() -> list[str]:
    return (os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc").split()


@lru_cache(maxsize=1)
def _compiler_identity() -> str:
    try:
        return subprocess.run(_cc() + ["--version"], capture_output=True, text=True).stdout
    except OSError:
        raise BuildError(f"no C compiler: '{' '.join(_cc())}' cannot be run; install gcc (apt-get install gcc)") from None


@lru_cache(maxsize=16)
def target_identity(sanitize: bool, target: str = "native") -> str:
    """What the flags compile for on this machine: the predefined macros (the ISA extensions
    -march turns on among them), sorted."""
    try:
        out = subprocess.run(_cc() + compile_args(sanitize, target) + ["-E", "-dM", "-x", "c", os.devnull],
                             capture_output=True, text=True)
    except OSError:
        raise BuildError(f"no C compiler: '{' '.join(_cc())}' cannot be run; install gcc (apt-get install gcc)") from None
    if out.returncode != 0:
        raise BuildError(f"the C compiler rejects kiln's flags {compile_args(sanitize, target)}: "
                         f"{out.stderr.strip()[:500]}")
    return "\n".join(sorted(out.stdout.splitlines()))


def _defines(src: CSource) -> list[str]:
    return [f"-D{d}" for d in src.defines]


def build_key(src: CSource) -> str:
    h = hashlib.sha256()
    for part in (__version__, sys.version, _compiler_identity(), target_identity(src.sanitize, src.target), src.cdef,
                 src.prelude, repr(compile_args(src.sanitize, src.target) + _defines(src))):
        h.update(part.encode())
        h.update(b"\0")
    for path in (*src.sources, *runtime_headers()):
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:24]


def load_extension(src: CSource, log=lambda s: None) -> ModuleType:
    """Build (or reuse) the extension for `src` and import it."""
    check_runs_here(src.target)
    modname = f"_kiln_{src.name}_{build_key(src)}"
    progress = as_progress(log)
    progress.note(f"cached: {modname}")
    if modname in sys.modules:
        return sys.modules[modname]
    lib = _cached_build(cache_dir() / "build" / modname, f"{modname}*.so",
                        lambda out: _compile_extension(src, modname, out, progress))
    spec = importlib.util.spec_from_file_location(modname, lib,
                                                  loader=importlib.machinery.ExtensionFileLoader(modname, str(lib)))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules[modname] = module
    return module


def build_c_library(src: CSource, api_headers: tuple[Path, ...], log=lambda s: None) -> Path:
    """`src` as a plain shared library, libkiln_<name>.so, cached like the extension: no cffi, no
    Python, built by the system C compiler. Only the functions the API headers declare are
    exported; the runtime's kernels stay internal, so they cannot clash with a program's own symbols."""
    declarations = (re.sub(r"/\*.*?\*/", "", header_cdef(h), flags=re.S) for h in api_headers)
    api = sorted({name for text in declarations for name in re.findall(r"\b(kiln_\w+)\s*\(", text)})
    key = build_key(CSource(src.name, "\n".join(api), "shared-library", src.sources, src.include_dirs, src.sanitize,
                            src.defines, src.target))
    filename = f"libkiln_{src.name}.so"

    def compile_into(out: Path) -> None:
        script = out / "exports.map"
        script.write_text("{\n  global:\n" + "".join(f"    {n};\n" for n in api) + "  local: *;\n};\n")
        includes = [f"-I{d}" for d in (*src.include_dirs, RUNTIME_DIR)]
        cmd = _cc() + compile_args(src.sanitize, src.target) + _defines(src) + ["-shared", "-fPIC", "-pthread", *includes,
                                                    *map(str, src.sources), f"-Wl,--version-script={script}",
                                                    "-lm", "-o", str(out / filename)]
        as_progress(log).work(f"cc -shared {filename}")
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise BuildError(f"building {filename} failed:\n{done.stderr.strip()[:2000]}")

    return _cached_build(cache_dir() / "build" / f"libkiln_{src.name}_{key}", filename, compile_into)


def _cached_build(out_dir: Path, pattern: str, build) -> Path:
    """The file matching `pattern` in out_dir, after build(staging_dir) has made it if it is missing.
    The staging directory is renamed into place whole, so a concurrent build of the same key wins
    or loses entirely and no reader sees half a library."""
    found = next(out_dir.glob(pattern), None) if out_dir.is_dir() else None
    if found is not None:
        return found
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f"{out_dir.name}-", dir=out_dir.parent) as tmp:
        staged = Path(tmp) / "out"
        staged.mkdir()
        build(staged)
        try:
            os.replace(staged, out_dir)
        except OSError:
            if not out_dir.is_dir():
                raise
    return next(out_dir.glob(pattern))


def _compile_extension(src: CSource, modname: str, out: Path, log) -> None:
    import cffi  # only needed when something must be compiled

    ffi = cffi.FFI()
    ffi.cdef(src.cdef)
    ffi.set_source(modname, src.prelude, sources=[str(s) for s in src.sources], include_dirs=[str(d) for d in (*src.include_dirs, RUNTIME_DIR)],
                   extra_compile_args=compile_args(src.sanitize, src.target) + _defines(src),
                   extra_link_args=["-fsanitize=address,undefined"] if src.sanitize else [], libraries=["m"])
    log.work(f"compiling {modname}: {len(src.sources)} C files, {' '.join(compile_args(src.sanitize, src.target))}")
    try:
        built = Path(ffi.compile(tmpdir=str(out.parent / "cffi"), verbose=False))
    except Exception as e:  # distutils/setuptools raise several unrelated types
        raise BuildError(f"building {src.name} failed: {e}") from None
    shutil.copy2(built, out / built.name)


def header_cdef(header: Path) -> str:
    """A runtime header's declarations for cffi: the same text without preprocessor lines."""
    return "\n".join(line for line in header.read_text().splitlines() if not line.lstrip().startswith("#"))


def runtime_kernels(sanitize: bool = False, log=lambda s: None, target: str = "native") -> ModuleType:
    """The runtime's kernels alone, for kernel tests and the packer."""
    return load_extension(CSource("runtime", header_cdef(RUNTIME_DIR / "kernels.h"), '#include "kernels.h"',
                                  runtime_sources(), sanitize=sanitize, target=target), log)
