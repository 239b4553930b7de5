"""The GGUF front end under hostile input: mutated copies of real files, read by read_model and
planned (template, graph, passes, layout). Every case ends in success or a KilnError that names
the file; never another exception, a crash, a hang over 5 s, or an allocation sized by an
unchecked field.

The cases mutate the headers of the bundled SmolLM2 file and of a small synthetic llama of the
same layout (its vocabulary is 259 tokens, so a case costs milliseconds instead of the 0.7 s
SmolLM2's 49k-token vocabulary takes to parse); the tensor data is left sparse. KILN_FUZZ_CASES
and KILN_FUZZ_REAL_CASES set how many cases each test runs (`make fuzz` runs 100,000 in all).
"""
from __future__ import annotations

import itertools
import os
import resource
import struct
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader
from hypothesis import HealthCheck, given, settings, strategies as st

from compiler.core.errors import KilnError
from compiler.core.options import CompileOptions
from compiler.planner.plan import plan
from synthetic import TinySpec, write_tiny_model

CASES = int(os.environ.get("KILN_FUZZ_CASES", "1800"))  # on the small llama
REAL_CASES = int(os.environ.get("KILN_FUZZ_REAL_CASES", str(max(CASES // 20, 20))))  # on SmolLM2: 0.7 s each
_names = itertools.count()


class Original:
    """A GGUF's header bytes, its full size (the data region stays sparse), and where its fields lie."""

    def __init__(self, path: Path):
        r = GGUFReader(path)
        self.size = os.path.getsize(path)
        with open(path, "rb") as f:
            self.header = f.read(r.data_offset)
        base = r.data.ctypes.data
        self.parts: list[tuple[int, int, str]] = []  # (offset, bytes, role) of every field part
        for field in r.fields.values():
            for i, part in enumerate(field.parts):
                role = "len" if part.dtype == np.uint64 and i in (0, 3) else "type" if part.dtype == np.uint32 and i == 2 else "data"
                self.parts.append((part.ctypes.data - base, part.nbytes, role))
        for t in r.tensors:
            for i, part in enumerate(t.field.parts):
                self.parts.append((part.ctypes.data - base, part.nbytes, ("name_len", "name", "n_dims", "dims", "type", "offset")[min(i, 5)]))
        self.parts = [p for p in self.parts if p[0] + p[1] <= len(self.header)]
        self.boundaries = sorted({0, 4, 8, 16, 24, len(self.header)} | {o for o, _, _ in self.parts})


def _write(orig: Original, header: bytes, tmp: Path, size: int | None = None) -> Path:
    path = tmp / f"case{next(_names)}.gguf"
    with open(path, "wb") as f:
        f.write(header)
        f.truncate(max(size if size is not None else orig.size, 0))
    return path


def _front_end(path: Path) -> None:
    """read_model, then the whole front end: a KilnError naming the file is the only failure allowed,
    and no case may allocate by an unchecked field (the address-space limit _fuzz sets turns such
    an allocation into a MemoryError, which fails the case)."""
    try:
        plan(path, CompileOptions(ctx=64, prefill_chunk=8))
    except KilnError as e:
        assert path.name in str(e), f"the error does not name the file: {e}"
    finally:
        path.unlink(missing_ok=True)


HUGE = [2**64 - 1, 2**63, 2**62 + 7, 2**40, 2**32 + 1, 2**31, 10**12]


KINDS = ["flip", "truncate", "huge", "type", "dup_key", "past_end", "misalign", "offset"]


@st.composite
def mutation(draw, orig: Original) -> tuple:
    """A mutation as a small tuple (so that a failing case prints short); apply() makes the bytes."""
    kind = draw(st.sampled_from(KINDS))
    pick = lambda roles: draw(st.integers(0, max(len([p for p in orig.parts if p[2] in roles]) - 1, 0)))
    if kind == "flip":
        return kind, tuple((draw(st.integers(0, len(orig.header) - 1)), draw(st.integers(0, 7)))
                           for _ in range(draw(st.integers(1, 8))))
    if kind == "truncate":
        return kind, draw(st.integers(0, len(orig.boundaries) - 1)), draw(st.integers(-3, 3))
    if kind == "huge":
        return kind, pick(("len", "name_len", "dims")), draw(st.sampled_from(HUGE))
    if kind == "type":
        return kind, pick(("type",)), draw(st.sampled_from(list(range(0, 14)) + [31, 99, 2**31]))
    if kind == "dup_key":
        return kind, pick(("data",)), pick(("data",))
    extra = {"past_end": st.integers(-64, 2**20), "misalign": st.integers(1, 31),
             "offset": st.sampled_from(HUGE + [2**64 - 32])}[kind]
    return kind, pick(("offset",)), draw(extra)


def apply(orig: Original, m: tuple) -> tuple[bytes, int]:
    h, kind = bytearray(orig.header), m[0]
    of = lambda roles, i: [p for p in orig.parts if p[2] in roles][i]
    if kind == "flip":
        for at, bit in m[1]:
            h[at] ^= 1 << bit
    elif kind == "truncate":
        cut = max(0, orig.boundaries[m[1]] + m[2])
        return bytes(h[:cut]), cut
    elif kind == "huge":
        off, n, _ = of(("len", "name_len", "dims"), m[1])
        h[off:off + n] = (m[2] % 2**(8 * n)).to_bytes(n, "little")
    elif kind == "type":
        off, n, _ = of(("type",), m[1])
        h[off:off + n] = (m[2] % 2**(8 * n)).to_bytes(n, "little")
    elif kind == "dup_key":
        (a, na, _), (b, nb, _) = of(("data",), m[1]), of(("data",), m[2])
        h[b:b + min(na, nb)] = h[a:a + min(na, nb)]
    else:
        off, _, _ = of(("offset",), m[1])
        (cur,) = struct.unpack_from("<Q", h, off)
        new = {"past_end": orig.size + m[2], "misalign": cur + m[2], "offset": m[2]}[kind]
        struct.pack_into("<Q", h, off, new % 2**64)
    return bytes(h), orig.size


@pytest.fixture(scope="module")
def tiny_original(tmp_path_factory):
    path = write_tiny_model(tmp_path_factory.mktemp("fuzz") / "tiny.gguf", TinySpec(arch="llama"))
    return Original(path)


@pytest.fixture(scope="module")
def smollm2_original(smollm2):
    return Original(smollm2)


CASE_MEMORY = 1 << 30  # what one case may map or allocate beyond what the process holds before the cases


def _fuzz(orig: Original, tmp_path: Path, cases: int) -> None:
    """The cases under an address-space limit: the process's size now plus CASE_MEMORY, which
    every case must keep to, whatever the cases before it did (a high-water mark would not tell)."""
    pages = int(Path("/proc/self/statm").read_text().split()[0])
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (pages * resource.getpagesize() + CASE_MEMORY, hard))
    try:
        _run_cases(orig, tmp_path, cases)
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def _run_cases(orig: Original, tmp_path: Path, cases: int) -> None:
    @settings(max_examples=cases, deadline=5000, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(data=st.data())
    def case(data):
        header, size = apply(orig, data.draw(mutation(orig)))
        _front_end(_write(orig, header, tmp_path, size))

    case()


def test_fuzzed_headers_of_a_small_llama(tiny_original, tmp_path):
    _fuzz(tiny_original, tmp_path, CASES)


def test_fuzzed_headers_of_smollm2(smollm2_original, tmp_path):
    _fuzz(smollm2_original, tmp_path, REAL_CASES)
