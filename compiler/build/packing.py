"""The packed weights file: matmul weights interleaved by eight rows (x8), written by the compiler.

Matmuls whose kernel reads the x8 layout (runtime_c/x8_pack.c) read their weights from this
file, which the library maps read-only next to the GGUF; nothing is copied at load. It is
written once per (GGUF, packing plan, packer), by the runtime's own packer, into the cache,
and only where this build has the x8 kernel: elsewhere the same calls read the GGUF rows.

Layout: a 64-byte header (magic, the GGUF's size and header CRC32, the packed bytes), then
the packed region exactly as the planner laid it out.
"""
from __future__ import annotations

import hashlib
import os
import struct
import zlib
from pathlib import Path

import numpy as np

from ..core.paths import RUNTIME_DIR
from .cc import runtime_kernels
from ..frontend.spec import ModelSpec
from ..planner.packed import PackedWeight, packed_bytes
from ..core.progress import as_progress

MAGIC = b"KILNX8\x00\x01"
HEADER = struct.Struct("<8sQIIQ")  # magic, GGUF bytes, GGUF header CRC32, 0, packed bytes
HEADER_BYTES = 64


def header_crc32(spec: ModelSpec) -> int:
    """CRC32 of the GGUF's header (everything before the tensor data): how a library knows its file."""
    with open(spec.path, "rb") as f:
        return zlib.crc32(f.read(spec.data_offset))


def packed_file(spec: ModelSpec, packed: tuple[PackedWeight, ...], cache: Path, library, log=lambda s: None) -> Path | None:
    """The packed file for these weights, written if missing; None where the library (a model's
    cffi lib) has no kernel that reads it."""
    progress = as_progress(log)
    if not packed or not library.kiln_reads_packed():
        progress.note("nothing to pack: every matmul reads the GGUF's rows on this build")
        return None
    crc = header_crc32(spec)
    plan = [(p.tensor, p.dtype.label, p.n_out, p.n_in, p.src, p.offset, p.size, p.src_size) for p in packed]
    packer = (RUNTIME_DIR / "x8_pack.c").read_bytes()
    key = hashlib.sha256(repr((spec.file_size, crc, plan)).encode() + packer).hexdigest()[:24]
    path = cache / "packed" / f"{spec.path.stem}-{key}.x8"
    total = HEADER_BYTES + packed_bytes(packed)
    if path.is_file() and path.stat().st_size == total:
        progress.note(f"cached: {path}")
        return path
    progress.work(f"{len(packed)} weight matrices ({packed_bytes(packed) / 2**20:.1f} MiB) into {path}")
    advance = progress.bar(packed_bytes(packed), "pack")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    gguf = np.memmap(spec.path, dtype=np.uint8, mode="r")
    kernels = runtime_kernels(log=progress)  # the packer is the runtime's own
    lib, ffi = kernels.lib, kernels.ffi
    with open(tmp, "wb") as f:
        f.write(HEADER.pack(MAGIC, spec.file_size, crc, 0, packed_bytes(packed)).ljust(HEADER_BYTES, b"\0"))
        for p in packed:
            src = np.ascontiguousarray(gguf[p.src:p.src + p.src_size])
            dst = np.empty(p.size, np.uint8)
            lib.kiln_pack_x8(p.dtype.value.value, ffi.from_buffer(src), ffi.from_buffer(dst), p.n_out, p.n_in)
            f.seek(HEADER_BYTES + p.offset)
            f.write(dst.tobytes())
            advance(p.size)
        f.truncate(total)
    os.replace(tmp, path)  # atomic: a reader sees the whole file or none
    return path
