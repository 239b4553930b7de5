"""A structural walk of a GGUF file's header before gguf-py parses it.

gguf-py trusts the lengths and counts it reads: a count set to 2^40 makes it loop or allocate
for that many elements, and a type id it does not know raises whatever its lookup raises. This
walk checks every length, count, type and offset against the bytes that are really there, in
one pass with no allocation sized by a field, so that a truncated or corrupted file is refused
with one clear message naming the file and the place.
"""
from __future__ import annotations

import mmap
import struct
from pathlib import Path

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

from ..core.errors import ModelFileError

_SCALAR = {GGUFValueType.UINT8: 1, GGUFValueType.INT8: 1, GGUFValueType.UINT16: 2, GGUFValueType.INT16: 2,
           GGUFValueType.UINT32: 4, GGUFValueType.INT32: 4, GGUFValueType.FLOAT32: 4, GGUFValueType.BOOL: 1,
           GGUFValueType.UINT64: 8, GGUFValueType.INT64: 8, GGUFValueType.FLOAT64: 8}
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_ARRAY_DEPTH = 4


class _Walk:
    def __init__(self, path: Path, buf) -> None:
        self.path, self.buf, self.at = path, buf, 0

    def fail(self, what: str) -> ModelFileError:
        return ModelFileError(f"{self.path}: corrupt or truncated GGUF header at byte {self.at:,}: {what}; "
                              "fetch the file again")

    def take(self, n: int, what: str) -> int:
        if n < 0 or self.at + n > len(self.buf):
            raise self.fail(f"{what} needs {n:,} bytes, {len(self.buf) - self.at:,} are left")
        start = self.at
        self.at += n
        return start

    def u32(self, what: str) -> int:
        return struct.unpack_from("<I", self.buf, self.take(4, what))[0]

    def u64(self, what: str) -> int:
        return struct.unpack_from("<Q", self.buf, self.take(8, what))[0]

    def string(self, what: str) -> bytes:
        n = self.u64(f"the length of {what}")
        return bytes(self.buf[self.take(n, what):self.at])

    def value(self, vtype: int, what: str, depth: int = 0) -> object:
        try:
            t = GGUFValueType(vtype)
        except ValueError:
            raise self.fail(f"{what} has value type {vtype}, which GGUF does not define") from None
        if t in _SCALAR:
            start = self.take(_SCALAR[t], what)
            return bytes(self.buf[start:self.at]) if t == GGUFValueType.UINT32 else None
        if t == GGUFValueType.STRING:
            return self.string(what)
        if depth >= MAX_ARRAY_DEPTH:
            raise self.fail(f"{what} nests arrays {depth + 1} deep")
        etype, count = self.u32(f"the element type of {what}"), self.u64(f"the length of {what}")
        try:
            size = _SCALAR.get(GGUFValueType(etype), 8)  # a string or an array takes at least its 8-byte length
        except ValueError:
            raise self.fail(f"{what} has element type {etype}, which GGUF does not define") from None
        if count * size > len(self.buf) - self.at:
            raise self.fail(f"{what} claims {count:,} elements, more than the file holds")
        if etype in (GGUFValueType.STRING, GGUFValueType.ARRAY):
            for i in range(count):
                self.value(etype, f"element {i} of {what}", depth + 1)
        else:
            self.take(count * size, what)
        return None


def check_layout(path: Path) -> None:
    """Refuse, naming the file, a GGUF whose header does not hold together."""
    with open(path, "rb") as f:
        size = f.seek(0, 2)
        if size == 0:
            raise ModelFileError(f"{path}: the file is empty")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            _check(path, buf, size)


def _check(path: Path, buf, size: int) -> None:
    w = _Walk(path, buf)
    w.take(4, "the magic")
    version = w.u32("the version")
    if version not in (2, 3):
        raise w.fail(f"GGUF version {version}; kiln reads versions 2 and 3")
    n_tensors, n_kv = w.u64("the tensor count"), w.u64("the metadata count")
    if n_kv > size // 12 or n_tensors > size // 24:  # the smallest entries: a 1-char key + type + u8; a tensor info
        raise w.fail(f"{n_kv:,} metadata entries and {n_tensors:,} tensors cannot fit in {size:,} bytes")
    alignment = 32
    keys: set[bytes] = set()
    for i in range(n_kv):
        key = w.string(f"the key of metadata entry {i}")
        if key in keys:
            raise w.fail(f"metadata key {key[:80]!r} appears twice")
        keys.add(key)
        raw = w.value(w.u32(f"the type of {key[:80]!r}"), f"metadata {key[:80]!r}")
        if key == b"general.alignment":
            if raw is None:
                raise w.fail("general.alignment must be a uint32")
            alignment = struct.unpack("<I", raw)[0]
            if alignment == 0 or alignment & (alignment - 1):
                raise w.fail(f"general.alignment {alignment} is not a power of two")
    infos = []
    for i in range(n_tensors):
        name = w.string(f"the name of tensor {i}")
        n_dims = w.u32(f"the rank of tensor {name[:80]!r}")
        if not 1 <= n_dims <= MAX_DIMS:
            raise w.fail(f"tensor {name[:80]!r} has {n_dims} dimensions (1 to {MAX_DIMS} allowed)")
        dims = [w.u64(f"a dimension of tensor {name[:80]!r}") for _ in range(n_dims)]
        ttype, offset = w.u32(f"the type of tensor {name[:80]!r}"), w.u64(f"the offset of tensor {name[:80]!r}")
        infos.append((name, dims, ttype, offset))
    data_start = -(-w.at // alignment) * alignment
    names: set[bytes] = set()
    for name, dims, ttype, offset in infos:
        shown = name[:80].decode("utf-8", "replace")
        if name in names:
            raise w.fail(f"tensor '{shown}' appears twice")
        names.add(name)
        n = 1
        for d in dims:
            if d == 0 or d > 1 << 40:
                raise w.fail(f"tensor '{shown}' has a dimension of {d:,}")
            n *= d
        if n > 1 << 40:
            raise w.fail(f"tensor '{shown}' has {n:,} elements")
        try:
            block, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(ttype)]
        except (ValueError, KeyError):
            continue  # an unknown type: read_model refuses it by name
        if dims[0] % block:
            raise w.fail(f"tensor '{shown}' rows of {dims[0]} are not whole blocks of {block}")
        nbytes = n // block * block_bytes
        if offset % alignment:
            raise w.fail(f"tensor '{shown}' starts at data offset {offset:,}, not a multiple of {alignment}")
        if data_start + offset + nbytes > size:
            raise w.fail(f"tensor '{shown}' ({nbytes:,} bytes at data offset {offset:,}) runs past the end "
                         f"of the {size:,}-byte file")
