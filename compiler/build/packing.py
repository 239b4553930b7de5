"""The packed weights file: matmul weights interleaved by eight rows (x8), written by the compiler.

Matmuls whose kernel reads the x8 layout (runtime_c/x8_pack.c) read their weights from this
file, which the library reads into memory in 2 MB pages at load (runtime_c/instance.c). It is
written once per (GGUF, packing plan, packer), by the runtime's own packer, into the cache,
and only where the build has the x8 kernels: elsewhere the same calls read the GGUF rows.

Layout: the runtime's header (kiln_packed_header: it names the GGUF by its size and header
CRC-32), then the packed region exactly as the planner laid it out.
"""
from __future__ import annotations

import hashlib
import os
import threading
from concurrent.futures import ThreadPoolExecutor
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
    plan = [(p.tensor, p.dtype.label, p.n_out, p.n_in, p.src, p.offset, p.size, p.src_size)
            + ((p.experts,) if p.experts else ()) for p in packed]
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
    with atomic_file(path) as f:
        f.truncate(total)
        _pack_into(f.fileno(), spec.path, packed, kernels, advance)
        header = np.zeros(PACKED_HEADER_BYTES, np.uint8)
        kernels.lib.kiln_packed_header(kernels.ffi.from_buffer(header), spec.file_size, crc, packed_bytes(packed))
        os.pwrite(f.fileno(), header, 0)
    return path


SLICE_BYTES = 4 << 20  # a thread packs this much of a matrix at a time: many slices, an even spread
FORGET_GAP = 1 << 20  # unpacked bytes between packed rows that are forgotten with them


def _pack_into(fd: int, gguf_path: Path, packed: tuple[PackedWeight, ...], kernels, advance) -> None:
    """Every matrix from the mapped GGUF into the file, in slices of whole 8-row groups, one thread
    a core: the packer is C and releases the GIL, so it runs at the speed of memory rather than of
    one core. Each thread packs a slice into a buffer of its own and writes it at its offset: a
    mapping of the new file would fault in its pages one at a time (measured on llama-1b's 624 MiB:
    0.6 to 1.2 GB/s through a mapping, 1.1 to 1.2 GB/s this way, fsync included)."""
    lib, ffi = kernels.lib, kernels.ffi
    gguf = np.memmap(gguf_path, dtype=np.uint8, mode="r")
    jobs = []
    for p in packed:  # an expert tensor: each expert's slice a matrix of its own
        t, row_bytes = p.dtype.value.value, p.src_size // (p.n_out * p.matrices)
        rows = max(8, SLICE_BYTES // row_bytes // 8 * 8)
        for e in range(p.matrices):
            src, dst = p.src + e * p.n_out * row_bytes, PACKED_HEADER_BYTES + p.offset + e * (p.size // p.matrices)
            for r0 in range(0, p.n_out, rows):
                n = min(rows, p.n_out - r0)
                jobs.append((t, src + r0 * row_bytes, n * row_bytes, dst + lib.kiln_x8_bytes(t, r0, p.n_in),
                             lib.kiln_x8_bytes(t, n, p.n_in), n, p.n_in))
    lock, mine = threading.Lock(), threading.local()

    def pack(job) -> None:
        t, src_at, src_size, dst_at, dst_size, n, n_in = job
        if getattr(mine, "buf", None) is None or mine.buf.size < dst_size:
            mine.buf = np.empty(dst_size, np.uint8)
        lib.kiln_pack_x8(t, ffi.from_buffer(gguf[src_at:src_at + src_size]), ffi.from_buffer(mine.buf), n, n_in)
        if os.pwrite(fd, memoryview(mine.buf)[:dst_size], dst_at) != dst_size:
            raise OSError(f"a short write packing into the packed file at offset {dst_at}")
        with lock:
            advance(dst_size)

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        list(pool.map(pack, jobs))
    del gguf
    _forget(gguf_path, [(job[1], job[2]) for job in jobs])


def _forget(path: Path, ranges: list[tuple[int, int]]) -> None:
    """Let the page cache drop the GGUF rows just packed: the model reads their packed copy from
    now on, so they would only sit beside it in memory (clean pages; a mapping that still holds
    them keeps them)."""
    if not hasattr(os, "posix_fadvise"):
        return
    spans: list[list[int]] = []  # the ranges merged across small gaps (norms, padding): the page cache's
    for at, size in sorted(ranges):  # folios can be larger than a page, and one is dropped only whole
        if spans and at - spans[-1][1] < FORGET_GAP:
            spans[-1][1] = max(spans[-1][1], at + size)
        else:
            spans.append([at, at + size])
    fd = os.open(path, os.O_RDONLY)
    try:
        for start, end in spans:
            os.posix_fadvise(fd, start, end - start, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
