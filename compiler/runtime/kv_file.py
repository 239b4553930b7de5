"""A sequence's KV cache in a file: `seq.save(path)` and `m.sequence_from(path)`.

    magic "KILNKV\\0\\1" | u32 header length | header (JSON) | state (kv_pool.h's bytes)

The header names what the bytes mean and what they belong to: the format version, the model
(GGUF size and header CRC32, as the library checks its weights), the KV dtypes and rotation,
the page size and each layer group's window and page bytes, the token ids, whether the state is
exactly what prefilling them gives (not after a context shift), and the state's length and
sha256. A file is written to a temporary name and renamed, so a reader never sees
half of one. Loading refuses, by name, a file for another model or another cache layout, and
a file whose bytes do not match their checksum.
"""
from __future__ import annotations

import hashlib
import json
import os
import struct
from pathlib import Path

from ..core.errors import KilnError
from ..core.files import atomic_file

MAGIC = b"KILNKV\0\1"
FORMAT = 1
_LEN = struct.Struct("<I")
MAX_HEADER = 64 << 20


class KVFileError(KilnError):
    """A KV state file that cannot be loaded into this model."""


def layout_identity(model) -> dict:
    """What a state's bytes depend on: the model and the planned cache layout."""
    spec, kv = model.spec, model.compiled.planned.layout.kv
    c = kv.config
    return {
        "gguf_bytes": spec.file_size,
        "gguf_header_crc32": spec.header_crc32,
        "kv_dtype_k": c.k_dtype.label,
        "kv_dtype_v": c.v_dtype.label,
        "kv_hadamard": [c.k_hadamard, c.v_hadamard],
        "k_transposed": kv.k_transposed,
        "page_size": c.page_size,
        "groups": [{"window": g.window or 0, "page_bytes": g.page_bytes} for g in kv.groups],
    }


def write(path: str | os.PathLike[str], model, tokens: list[int], state: bytes, exact: bool = True) -> int:
    """Write atomically; returns the file's size. exact: the state is what prefilling the tokens
    gives (not a shifted cache), so a prefix cache may take it."""
    header = {"format": FORMAT, "model": model.spec.path.name, **layout_identity(model), "tokens": list(tokens),
              "exact": bool(exact), "state_bytes": len(state), "state_sha256": hashlib.sha256(state).hexdigest()}
    blob = json.dumps(header, separators=(",", ":")).encode()
    path = Path(path)
    try:
        with atomic_file(path, mode=0o600) as f:  # a cache holds what its prompts said: the owner's alone
            f.write(MAGIC + _LEN.pack(len(blob)) + blob)
            f.write(state)
    except OSError as e:
        raise KVFileError(f"{path}: cannot write the KV state ({e.strerror})") from None
    return len(MAGIC) + _LEN.size + len(blob) + len(state)


def read(path: str | os.PathLike[str], model) -> tuple[list[int], bytes, bool]:
    """The tokens, state bytes and exactness of a file written for this model and cache layout."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise KVFileError(f"{path}: cannot read it ({e.strerror})") from None
    if data[:len(MAGIC)] != MAGIC:
        raise KVFileError(f"{path}: not a kiln KV state file (no KILNKV header)")
    at = len(MAGIC) + _LEN.size
    if len(data) < at:
        raise KVFileError(f"{path}: truncated header")
    (n,) = _LEN.unpack_from(data, len(MAGIC))
    if n > MAX_HEADER or at + n > len(data):
        raise KVFileError(f"{path}: truncated or corrupted header ({n} bytes announced)")
    try:
        header = json.loads(data[at:at + n])
        if not isinstance(header, dict):
            raise ValueError("not an object")
    except (ValueError, UnicodeDecodeError) as e:
        raise KVFileError(f"{path}: corrupted header ({e})") from None
    if header.get("format") != FORMAT:
        raise KVFileError(f"{path}: format {header.get('format')!r}; this kiln reads format {FORMAT}")
    want = layout_identity(model)
    for key, value in want.items():
        if header.get(key) != value:
            what = "model (GGUF size or header)" if key.startswith("gguf") else key
            raise KVFileError(f"{path}: written for another {what}: {key} is {header.get(key)!r} in the file, "
                              f"{value!r} here (model {header.get('model')!r}); load it with the options it was "
                              "saved with")
    state = data[at + n:]
    tokens = header.get("tokens")
    if (header.get("state_bytes") != len(state) or
            header.get("state_sha256") != hashlib.sha256(state).hexdigest()):
        raise KVFileError(f"{path}: the KV state does not match its checksum (corrupted or truncated)")
    if not isinstance(tokens, list) or not all(isinstance(t, int) and 0 <= t < model.n_vocab for t in tokens):
        raise KVFileError(f"{path}: corrupted token list")
    return tokens, state, header.get("exact") is True
