"""The read bandwidth that bounds decode: measured by a small C kernel (runtime_c/bench/read_bw.c:
every thread sums its slice of a 1 GiB buffer with vector loads, best of several passes, as STREAM
does), and, for comparison with earlier figures, by numpy."""
from __future__ import annotations

import time

import numpy as np

from ..build.cc import header_cdef
from ..build.extension import Extension, load_extension
from ..core.paths import RUNTIME_DIR

BENCH_DIR = RUNTIME_DIR / "bench"


def read_bandwidth_c(threads: int, nbytes: int = 1 << 30, passes: int = 5, log=lambda s: None) -> float:
    """GB/s that `threads` threads read together, the best of `passes`."""
    mod = load_extension(Extension("read_bw", header_cdef(BENCH_DIR / "read_bw.h"), '#include "read_bw.h"',
                                   (BENCH_DIR / "read_bw.c",), (BENCH_DIR,)), log)
    rate = mod.lib.kiln_read_bandwidth(threads, nbytes, passes)
    if rate <= 0:
        raise MemoryError(f"the read-bandwidth kernel could not allocate {nbytes >> 20} MiB")
    return rate / 1e9


def read_bandwidth_numpy(threads: int = 1, nbytes: int = 192 << 20, reps: int = 5) -> float:
    """Best-of-N read of a buffer larger than the caches by `threads` threads at once, each
    summing its own slice with numpy (which releases the GIL while it reads)."""
    from concurrent.futures import ThreadPoolExecutor

    a = np.ones(nbytes // 8, dtype=np.float64)
    slices = np.array_split(a, threads)
    best = float("inf")
    with ThreadPoolExecutor(threads) as pool:
        for _ in range(reps):
            t0 = time.perf_counter()
            list(pool.map(np.sum, slices))
            best = min(best, time.perf_counter() - t0)
    return nbytes / best / 1e9
