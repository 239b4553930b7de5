"""The packed weights file: matmul weights interleaved by eight rows (x8), written by the compiler.

Matmuls whose kernel reads the x8 layout (runtime_c/x8_pack.c) read their weights from this
file, which the library maps read-only next to the GGUF; nothing is copied at load. It is
written once per (GGUF, packing plan, packer), by the runtime's own packer, into the cache,
and only where the build has the x8 kernels: elsewhere the same calls read the GGUF rows.

Layout: the runtime's header (kiln_packed_header: it names the GGUF by its size and header
CRC-32), then the packed region exactly as the planner laid it out.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from ..core.cconst import PACKED_HEADER_BYTES
from ..core.files import atomic_file
from ..core.paths import RUNTIME_DIR, cache_dir
from ..core.progress import as_progress
from ..frontend.spec import ModelSpec
from ..planner.packed import PackedWeight, packed_bytes
from .runtime import runtime_kernels


def packed_file(spec: ModelSpec, packed: tuple[PackedWeight, ...], x8_kernels: bool, log=lambda s: None) -> Path | None:
    """The packed file for these weights, written if missing; None where nothing is packed or the
    library has no kernels that read it."""
    progress = as_progress(log)
    if not packed or not x8_kernels:
        progress.note("nothing to pack: every matmul reads the GGUF's rows on this build")
        return None
    crc = spec.header_crc32
    plan = [(p.tensor, p.dtype.label, p.n_out, p.n_in, p.src, p.offset, p.size, p.src_size) for p in packed]
    packer = (RUNTIME_DIR / "x8_pack.c").read_bytes()
    key = hashlib.sha256(repr((spec.file_size, crc, plan)).encode() + packer).hexdigest()[:24]
    path = cache_dir() / "packed" / f"{spec.path.stem}-{key}.x8"
    total = PACKED_HEADER_BYTES + packed_bytes(packed)
    if path.is_file() and path.stat().st_size == total:
        progress.note(f"cached: {path}")
        return path
    kernels = runtime_kernels(log=progress)  # the packer is the runtime's own
    progress.work(f"{len(packed)} weight matrices ({packed_bytes(packed) / 2**20:.1f} MiB) into {path}")
    advance = progress.bar(packed_bytes(packed), "pack")
    gguf = np.memmap(spec.path, dtype=np.uint8, mode="r")
    lib, ffi = kernels.lib, kernels.ffi
    with atomic_file(path) as f:
        header = np.zeros(PACKED_HEADER_BYTES, np.uint8)
        lib.kiln_packed_header(ffi.from_buffer(header), spec.file_size, crc, packed_bytes(packed))
        f.write(header.tobytes())
        for p in packed:
            src = np.ascontiguousarray(gguf[p.src:p.src + p.src_size])
            dst = np.empty(p.size, np.uint8)
            lib.kiln_pack_x8(p.dtype.value.value, ffi.from_buffer(src), ffi.from_buffer(dst), p.n_out, p.n_in)
            f.seek(PACKED_HEADER_BYTES + p.offset)
            f.write(dst.tobytes())
            advance(p.size)
        f.truncate(total)
    return path
