"""A GGUF file's header, read in one checked pass: its metadata and its tensor table.

Every length, count, type and offset is checked against the bytes that are really there, with
no allocation sized by a field before that check, so that a truncated or corrupted file is
refused with one message naming the file and the place. gguf-py's reader trusts what it reads (a
count of 2^40 makes it loop or allocate for that many elements) and slices a numpy view per
element: Gemma 3's 262k-token vocabulary took it 5 s, this walk 0.3 s. A numeric
array is one np.frombuffer; a string array is a loop over lengths, the one thing GGUF's layout
leaves sequential.
"""
from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

from ..core.errors import ModelFileError

# a scalar type's struct code, and so its size and its numpy dtype
_SCALAR = {GGUFValueType.UINT8: "B", GGUFValueType.INT8: "b", GGUFValueType.UINT16: "H", GGUFValueType.INT16: "h",
           GGUFValueType.UINT32: "I", GGUFValueType.INT32: "i", GGUFValueType.FLOAT32: "f", GGUFValueType.BOOL: "?",
           GGUFValueType.UINT64: "Q", GGUFValueType.INT64: "q", GGUFValueType.FLOAT64: "d"}
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_ARRAY_DEPTH = 4
_U64 = struct.Struct("<Q")


@dataclass(frozen=True)
class Field:
    """A metadata value: its GGUF type (an array's element type beside it) and its Python value
    (an array as a list). A string's bytes are decoded when the value is asked for, so that a
    key no one reads cannot fail the file."""
    type: GGUFValueType
    raw: object
    elem: GGUFValueType | None = None

    def contents(self):
        """The value; a string that is not UTF-8 raises UnicodeDecodeError."""
        if self.elem in _SCALAR:
            return self.raw  # numbers: nothing to decode, and a vocabulary's scores are 262k of them
        return _decode(self.raw)


def _decode(raw):
    if isinstance(raw, bytes):
        return raw.decode("utf-8")
    if isinstance(raw, list):
        return [_decode(v) for v in raw]
    return raw


@dataclass(frozen=True)
class TensorEntry:
    name: str
    dims: tuple[int, ...]  # GGUF's order: the row length first
    type_id: int
    offset: int  # absolute, in the file


@dataclass(frozen=True)
class Header:
    version: int
    fields: dict[str, Field]
    tensors: list[TensorEntry]
    data_offset: int  # the first byte of tensor data: everything before it is the header


class _Walk:
    def __init__(self, path: Path, buf) -> None:
        self.path, self.buf, self.at = path, buf, 0

    def fail(self, what: str) -> ModelFileError:
        return ModelFileError(f"{self.path}: corrupt or truncated GGUF header at byte {self.at:,}: {what}; "
                              "fetch the file again")

    def take(self, n: int, what) -> int:
        if n < 0 or self.at + n > len(self.buf):
            raise self.fail(f"{what() if callable(what) else what} needs {n:,} bytes, "
                            f"{len(self.buf) - self.at:,} are left")
        start = self.at
        self.at += n
        return start

    def u32(self, what) -> int:
        return struct.unpack_from("<I", self.buf, self.take(4, what))[0]

    def u64(self, what) -> int:
        return _U64.unpack_from(self.buf, self.take(8, what))[0]

    def string(self, what) -> bytes:
        n = self.u64(lambda: f"the length of {what() if callable(what) else what}")
        return self.buf[self.take(n, what):self.at]

    def strings(self, count: int, what: str) -> list[bytes]:
        """count strings in a row: the hot loop of a vocabulary, so its checks are inlined."""
        buf, at, end, out = self.buf, self.at, len(self.buf), []
        unpack = _U64.unpack_from
        for i in range(count):
            if at + 8 > end:
                self.at = at
                raise self.fail(f"the length of element {i} of {what} needs 8 bytes, {end - at:,} are left")
            n = unpack(buf, at)[0]
            at += 8
            if at + n > end:
                self.at = at
                raise self.fail(f"element {i} of {what} needs {n:,} bytes, {end - at:,} are left")
            out.append(buf[at:at + n])
            at += n
        self.at = at
        return out

    def value_type(self, vtype: int, what: str) -> GGUFValueType:
        try:
            return GGUFValueType(vtype)
        except ValueError:
            raise self.fail(f"{what} has value type {vtype}, which GGUF does not define") from None

    def value(self, t: GGUFValueType, what: str, depth: int = 0) -> Field:
        if t in _SCALAR:
            code = _SCALAR[t]
            return Field(t, struct.unpack_from("<" + code, self.buf, self.take(struct.calcsize(code), what))[0])
        if t == GGUFValueType.STRING:
            return Field(t, self.string(what))
        if depth >= MAX_ARRAY_DEPTH:
            raise self.fail(f"{what} nests arrays {depth + 1} deep")
        etype = self.value_type(self.u32(f"the element type of {what}"), f"the elements of {what}")
        count = self.u64(f"the length of {what}")
        size = struct.calcsize(_SCALAR[etype]) if etype in _SCALAR else 8  # a string or array: its 8-byte length
        if count * size > len(self.buf) - self.at:
            raise self.fail(f"{what} claims {count:,} elements, more than the file holds")
        if etype in _SCALAR:
            start = self.take(count * size, what)
            items = np.frombuffer(self.buf, "<" + _SCALAR[etype], count, start).tolist()
        elif etype == GGUFValueType.STRING:
            items = self.strings(count, what)
        else:
            items = [self.value(GGUFValueType.ARRAY, f"element {i} of {what}", depth + 1).raw for i in range(count)]
        return Field(t, items, etype)


def read_header(path: Path) -> Header:
    """The header of a GGUF, or a ModelFileError naming the file and what does not hold together."""
    with open(path, "rb") as f:
        size = f.seek(0, 2)
        if size == 0:
            raise ModelFileError(f"{path}: the file is empty")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:  # a slice of it is a copy, as bytes
            return _read(_Walk(path, m), size)


def _read(w: _Walk, size: int) -> Header:
    w.take(4, "the magic")
    version = w.u32("the version")
    if version not in (2, 3):
        raise w.fail(f"GGUF version {version}; kiln reads versions 2 and 3")
    n_tensors, n_kv = w.u64("the tensor count"), w.u64("the metadata count")
    if n_kv > size // 12 or n_tensors > size // 24:  # the smallest entries: a 1-char key + type + u8; a tensor info
        raise w.fail(f"{n_kv:,} metadata entries and {n_tensors:,} tensors cannot fit in {size:,} bytes")
    fields: dict[str, Field] = {}
    for i in range(n_kv):
        raw_key = w.string(f"the key of metadata entry {i}")
        key = raw_key.decode("utf-8", "replace")
        if key in fields:
            raise w.fail(f"metadata key {raw_key[:80]!r} appears twice")
        shown = f"metadata {raw_key[:80]!r}"
        field = w.value(w.value_type(w.u32(f"the type of {raw_key[:80]!r}"), shown), shown)
        fields[key] = field
    alignment = fields.get("general.alignment")
    if alignment is not None and alignment.type != GGUFValueType.UINT32:
        raise w.fail("general.alignment must be a uint32")
    align = 32 if alignment is None else alignment.raw
    if align == 0 or align & (align - 1):
        raise w.fail(f"general.alignment {align} is not a power of two")
    infos = []
    for i in range(n_tensors):
        name = w.string(f"the name of tensor {i}")
        n_dims = w.u32(f"the rank of tensor {name[:80]!r}")
        if not 1 <= n_dims <= MAX_DIMS:
            raise w.fail(f"tensor {name[:80]!r} has {n_dims} dimensions (1 to {MAX_DIMS} allowed)")
        dims = tuple(w.u64(f"a dimension of tensor {name[:80]!r}") for _ in range(n_dims))
        ttype, offset = w.u32(f"the type of tensor {name[:80]!r}"), w.u64(f"the offset of tensor {name[:80]!r}")
        infos.append((name, dims, ttype, offset))
    data_start = -(-w.at // align) * align
    tensors, names = [], set()
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
        if offset % align:
            raise w.fail(f"tensor '{shown}' starts at data offset {offset:,}, not a multiple of {align}")
        try:
            block, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(ttype)]
        except (ValueError, KeyError):
            block = None  # a type gguf does not know: read_model refuses it by name
        if block is not None:
            if dims[0] % block:
                raise w.fail(f"tensor '{shown}' rows of {dims[0]} are not whole blocks of {block}")
            nbytes = n // block * block_bytes
            if data_start + offset + nbytes > size:
                raise w.fail(f"tensor '{shown}' ({nbytes:,} bytes at data offset {offset:,}) runs past the end "
                             f"of the {size:,}-byte file")
        try:
            text = name.decode("utf-8")
        except UnicodeDecodeError:
            raise w.fail(f"tensor name {name[:80]!r} is not UTF-8") from None
        tensors.append(TensorEntry(text, dims, ttype, data_start + offset))
    return Header(version, fields, tensors, data_start)

