"""How many threads a model runs by default: the physical cores this process may use."""
from __future__ import annotations

import os
from pathlib import Path


def default_threads() -> int:
    """Physical cores this process may run on: SMT siblings share one core's units and would
    only contend in the matmuls."""
    try:
        cpus = os.sched_getaffinity(0)
    except AttributeError:
        return os.cpu_count() or 1
    cores = set()
    for cpu in cpus:
        topo = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
        try:
            cores.add((topo.joinpath("physical_package_id").read_text(), topo.joinpath("core_id").read_text()))
        except OSError:
            cores.add(("cpu", str(cpu)))
    return max(1, len(cores))
