"""The C compiler, and builds cached in $KILN_CACHE/build by a content hash.

A key covers everything that changes a binary (sources and headers, flags, the compiler, kiln's
version, the target's instruction set); a second build with the same key is a lookup. A build is
staged in a temporary directory and renamed into place whole, so that concurrent builders of
one key race harmlessly and no reader sees half a library.
"""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import sysconfig
import tempfile
from functools import lru_cache
from pathlib import Path
from typing import Callable, Iterable

from ..core.errors import BuildError
from ..core.paths import cache_dir
from ..core.version import __version__


def cc() -> list[str]:
    """This CPU's C compiler (build/targets.py names a cross compiler for another architecture)."""
    return (os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc").split()


@lru_cache(maxsize=4)
def compiler_identity(command: tuple[str, ...] | None = None) -> str:
    command = list(command or cc())
    try:
        return subprocess.run(command + ["--version"], capture_output=True, text=True).stdout
    except OSError:
        raise BuildError(f"no C compiler: '{' '.join(command)}' cannot be run; install gcc (apt-get install gcc)") from None


def run(cmd: list[str], what: str) -> None:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True)
    except OSError as e:
        raise BuildError(f"{what}: cannot run {cmd[0]} ({e.strerror}); install gcc (apt-get install gcc)") from None
    if done.returncode != 0:
        raise BuildError(f"{what} failed:\n{done.stderr.strip()[:2000]}")


RECIPE = tuple(sorted(Path(__file__).parent.glob("*.py")))  # how kiln builds: a change to it rebuilds


def build_key(parts: Iterable[str], files: Iterable[Path] = (), compiler: list[str] | None = None) -> str:
    """The key of a build by `compiler` (this CPU's by default) from these strings and files."""
    compiler = compiler or cc()
    h = hashlib.sha256()
    for part in (__version__, sys.version, " ".join(compiler), compiler_identity(tuple(compiler)), *parts):
        h.update(part.encode())
        h.update(b"\0")
    for path in (*RECIPE, *files):
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:24]


def cached_build(name: str, pattern: str, build: Callable[[Path], None]) -> tuple[Path, bool]:
    """The file matching `pattern` in $KILN_CACHE/build/<name>, after build(staging dir) has made
    it if it is missing; and whether it was there already."""
    out_dir = cache_dir() / "build" / name
    found = next(out_dir.glob(pattern), None) if out_dir.is_dir() else None
    if found is not None:
        return found, True
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
    return next(out_dir.glob(pattern)), False


def header_cdef(header: Path) -> str:
    """A header's declarations for cffi: the same text without preprocessor lines."""
    return "\n".join(line for line in header.read_text().splitlines() if not line.lstrip().startswith("#"))


def preprocessed_cdef(header: Path) -> str:
    """A header with no system includes, as the C preprocessor expands it (its X-macros become the
    declarations they stand for), for cffi."""
    done = subprocess.run(cc() + ["-E", "-P", "-x", "c", str(header)], capture_output=True, text=True)
    if done.returncode != 0:
        raise BuildError(f"preprocessing {header} failed:\n{done.stderr.strip()[:2000]}")
    return done.stdout
