"""Read a GGUF file into a typed ModelSpec (spec.py): hyperparameters, tensor table, tokenizer data
(vocab.py); read_vocab reads only the tokenizer, of any GGUF, vocab-only files included.

The header is read by gguf_header.py in one checked pass. Everything kiln relies on is checked
here, so the later stages can trust the spec: a foreign or truncated file, an architecture without a
template, a missing hyperparameter or an unsupported quant type stops with a message that
names the file and the culprit.
"""
from __future__ import annotations

import hashlib
import os
import zlib
from functools import lru_cache
from pathlib import Path

import numpy as np
from gguf import GGUF_MAGIC, GGMLQuantizationType, GGUFValueType

from ..core.dtypes import DType, WEIGHT_DTYPES, weight_dtype
from .gguf_header import Header, read_header
from .metadata import (check_unimplemented, per_layer, read_experts, read_layers, read_recurrent, read_rope_scaling,
                       read_scalars)
from .spec import HParams, ModelSpec, TensorInfo, TokenizerData
from .vocab import read_tokenizer
from ..core.errors import ModelFileError
from .architecture import ROPE_FACTOR_TENSORS, Architecture
from .architecture_file import available_archs, load_architecture


def read_model(path: str | os.PathLike[str]) -> ModelSpec:
    """Parse and check a GGUF file. Cached per (path, size, mtime) within the process."""
    p, st = _stat(path)
    return _read_cached(p, st.st_size, st.st_mtime_ns)


def read_vocab(path: str | os.PathLike[str]) -> TokenizerData:
    """Only the tokenizer of a GGUF: any architecture, tensors or none (llama.cpp's vocab-only files).
    The file is checked as read_model checks it."""
    p, st = _stat(path)
    return _read_vocab_cached(p, st.st_size, st.st_mtime_ns)


def _stat(path: str | os.PathLike[str]) -> tuple[Path, os.stat_result]:
    p = Path(path).resolve()
    try:
        return p, p.stat()
    except OSError as e:
        raise ModelFileError(f"{path}: cannot open model file ({e.strerror})") from None


def _open(path: Path, size: int) -> Header:
    _check_magic(path, size)
    return read_header(path)


@lru_cache(maxsize=8)
def _read_vocab_cached(path: Path, size: int, _mtime_ns: int) -> TokenizerData:
    return read_tokenizer(_Metadata(path, _open(path, size)))


@lru_cache(maxsize=8)
def _read_cached(path: Path, size: int, _mtime_ns: int) -> ModelSpec:
    header = _open(path, size)
    meta = _Metadata(path, header)
    arch = meta.text("general.architecture")
    if arch not in available_archs():
        raise ModelFileError(
            f"{path}: unknown architecture '{arch}': there is no template for it "
            f"(supported: {', '.join(available_archs())}); add templates/{arch}.json to support it"
        )
    tokenizer = read_tokenizer(meta)
    tensors = _read_tensors(path, header, size)
    template = load_architecture(arch)
    hparams = _read_hparams(meta, template, tokenizer)
    _check_tensors_fit(path, tensors, hparams, template)
    with open(path, "rb") as f:
        head = f.read(header.data_offset)
    return ModelSpec(
        path=path,
        arch=arch,
        name=meta.text("general.name", default=path.stem),
        file_size=size,
        data_offset=header.data_offset,
        header_sha256=hashlib.sha256(head).hexdigest(),
        header_crc32=zlib.crc32(head),
        hparams=hparams,
        tensors=tensors,
        tokenizer=tokenizer,
    )


def _check_magic(path: Path, size: int) -> None:
    with open(path, "rb") as f:
        head = f.read(8)
    if len(head) < 4 or int.from_bytes(head[:4], "little") != GGUF_MAGIC:
        raise ModelFileError(
            f"{path}: not a GGUF file (magic {head[:4]!r}, expected b'GGUF'); "
            "pass a .gguf model or a bundled model name (see `kiln models`)"
        )
    if size < 24:
        raise ModelFileError(f"{path}: truncated GGUF ({size} bytes, shorter than the fixed header)")


_MISSING = object()


class _Metadata:
    """Typed access to GGUF key/values; a missing required key names the file and the key."""

    def __init__(self, path: Path, header: Header):
        self.path = path
        self.fields = header.fields

    def get(self, key: str):
        f = self.fields.get(key)
        return None if f is None else self._contents(key, f)

    def _contents(self, key: str, f):
        try:
            return f.contents()
        except (UnicodeDecodeError, ValueError, IndexError) as e:
            raise ModelFileError(f"{self.path}: metadata key '{key}' is corrupt ({e}); fetch the file again") from None

    def keys(self) -> list[str]:
        return list(self.fields)

    def _scalar(self, key: str, default):
        v = self.get(key)
        if v is None:
            if default is _MISSING:
                raise ModelFileError(
                    f"{self.path}: metadata key '{key}' is missing; the file is incomplete or not an LLM GGUF"
                )
            return default
        if isinstance(v, list):
            raise ModelFileError(
                f"{self.path}: metadata key '{key}' is per-layer ({len(v)} values); kiln supports one value for all layers"
            )
        return v

    def integer(self, key: str, default=_MISSING) -> int | None:
        v = self._scalar(key, default)
        return None if v is None else int(v)

    def number(self, key: str, default=_MISSING) -> float:
        return float(self._scalar(key, default))

    def text(self, key: str, default=_MISSING) -> str | None:
        v = self._scalar(key, default)
        return None if v is None else str(v)

    def flag(self, key: str, default: bool) -> bool:
        return bool(self._scalar(key, default))

    def array(self, key: str) -> list | None:
        f = self.fields.get(key)
        if f is None:
            return None
        if f.type != GGUFValueType.ARRAY:
            raise ModelFileError(f"{self.path}: metadata key '{key}' should be an array")
        return self._contents(key, f)


MAX_HEAD_DIM = 512  # KILN_MAX_HEAD_DIM in runtime_c/kernels.h: the kernels' per-head stack buffers


def _check_tensors_fit(path: Path, tensors: dict, hp: HParams, t: Architecture) -> None:
    """The hyperparameters describe the tensors that are there: one set per block (the planner
    loops over block_count, so it must not be larger than the file), token_embd's rows cover the
    vocabulary, and the LM head has one row per token."""
    blocks = {name.split(".")[1] for name in tensors if name.startswith("blk.")}
    if hp.n_layer > len(blocks) or any(not b.isdigit() or int(b) >= hp.n_layer for b in blocks):
        raise ModelFileError(f"{path}: block_count is {hp.n_layer} but the file holds tensors for {len(blocks)} "
                             "blocks (blk.0 ..); the metadata and the tensors disagree")
    emb, out = tensors.get("token_embd.weight"), tensors.get("output.weight")
    if emb is None:
        raise ModelFileError(f"{path}: tensor 'token_embd.weight' is missing")
    if emb.shape[0] < hp.n_vocab or emb.shape[1] != hp.n_embd:
        raise ModelFileError(f"{path}: tensor 'token_embd.weight' is {list(emb.shape)} but the vocabulary has "
                             f"{hp.n_vocab} tokens of {hp.n_embd} (rows x embedding_length); the file is inconsistent")
    if out is not None and tuple(out.shape) != (hp.n_vocab, hp.n_embd):
        raise ModelFileError(f"{path}: tensor 'output.weight' is {list(out.shape)} but the vocabulary has "
                             f"{hp.n_vocab} tokens of {hp.n_embd}; its rows must match the vocabulary")
    factors = ROPE_FACTOR_TENSORS[t.rope_factors]
    for name in (n for names in ROPE_FACTOR_TENSORS.values() for n in names):
        if name not in tensors:
            continue
        if name not in factors:
            raise ModelFileError(f"{path}: tensor '{name}' (per-dimension rope frequency factors) is not implemented "
                                 f"by kiln for {t.arch}")
        f = tensors[name]
        if f.dtype is not DType.F32 or f.shape != (hp.n_rot // 2,):
            raise ModelFileError(f"{path}: tensor '{name}' is {f.dtype.name} {list(f.shape)}; rope factors are F32 "
                                 f"[{hp.n_rot // 2}] (half the rotated dimensions)")


def _read_hparams(meta: _Metadata, t: Architecture, tok: TokenizerData) -> HParams:
    a = t.arch
    check_unimplemented(meta, t)
    n_embd = meta.integer(f"{a}.embedding_length")
    n_head = meta.integer(f"{a}.attention.head_count")
    head_dim = meta.integer(f"{a}.attention.key_length", default=n_embd // max(n_head, 1))
    value_dim = meta.integer(f"{a}.attention.value_length", default=head_dim)
    if value_dim != head_dim:
        raise ModelFileError(f"{meta.path}: key_length {head_dim} != value_length {value_dim}; kiln needs them equal")
    n_layer = meta.integer(f"{a}.block_count")
    if t.kind_bodies:  # one value, or one per layer
        n_ff, layer_n_ff = per_layer(meta, f"{a}.feed_forward_length", n_layer)
        n_head_kv, layer_n_head_kv = per_layer(meta, f"{a}.attention.head_count_kv", n_layer, default=n_head)
    else:
        n_ff, layer_n_ff = meta.integer(f"{a}.feed_forward_length"), ()
        n_head_kv, layer_n_head_kv = meta.integer(f"{a}.attention.head_count_kv", default=n_head), ()
    n_rot = meta.integer(f"{a}.rope.dimension_count", default=head_dim)
    hp = HParams(
        n_layer=n_layer,
        n_embd=n_embd,
        n_ff=n_ff,
        n_head=n_head,
        n_head_kv=n_head_kv,
        head_dim=head_dim,
        n_rot=n_rot,
        n_vocab=len(tok.tokens),
        rope_base=meta.number(f"{a}.rope.freq_base", default=10000.0),
        norm_eps=meta.number(f"{a}.attention.layer_norm_epsilon" if t.norm == "layer"
                             else f"{a}.attention.layer_norm_rms_epsilon"),
        n_ctx_train=meta.integer(f"{a}.context_length"),
        sliding_window=meta.integer(f"{a}.attention.sliding_window", default=None),
        scalars=read_scalars(meta, t),
        **read_rope_scaling(meta, t),
        **read_experts(meta, t, n_layer),
        **read_recurrent(meta, t, n_layer=n_layer, head_dim=head_dim),
        **read_layers(meta, t, n_layer, n_head, head_dim, n_rot),
        layer_n_ff=layer_n_ff, layer_n_head_kv=layer_n_head_kv,
        causal=t.causal == "always" or (t.causal == "metadata" and meta.get(f"{a}.attention.causal") is not False),
        pooling=meta.integer(f"{a}.pooling_type", default=None),
    )
    for field in ("n_layer", "n_embd", "n_ff", "n_head", "n_head_kv", "head_dim", "n_vocab"):
        if getattr(hp, field) <= 0:
            raise ModelFileError(f"{meta.path}: hyperparameter {field} = {getattr(hp, field)} must be positive")
    if hp.head_dim > MAX_HEAD_DIM:
        raise ModelFileError(f"{meta.path}: head_dim {hp.head_dim} (attention.key_length) is above {MAX_HEAD_DIM}, "
                             "the most kiln's attention and rope kernels hold")
    for il, kv in enumerate(hp.layer_n_head_kv or (hp.n_head_kv,)):
        if kv <= 0 or hp.n_head % kv:
            raise ModelFileError(f"{meta.path}: head_count {hp.n_head} is not a multiple of layer {il}'s head_count_kv "
                                 f"{kv}")
    if any(n <= 0 for n in hp.layer_n_ff):
        raise ModelFileError(f"{meta.path}: every layer's feed_forward_length must be positive, got {hp.layer_n_ff}")
    if not (0 < hp.n_rot <= hp.head_dim and hp.n_rot % 2 == 0):
        raise ModelFileError(f"{meta.path}: rope.dimension_count {hp.n_rot} must be even and between 2 and "
                             f"head_dim {hp.head_dim}")
    return hp


def _read_tensors(path: Path, header: Header, size: int) -> dict[str, TensorInfo]:
    tensors: dict[str, TensorInfo] = {}
    for t in header.tensors:
        dtype = weight_dtype(t.type_id)
        if dtype is None:
            try:
                kind = GGMLQuantizationType(t.type_id).name
            except ValueError:
                raise ModelFileError(f"{path}: tensor '{t.name}' has type id {t.type_id}, which GGML does not define; "
                                     "the file is corrupt, or newer than kiln's gguf package") from None
            raise ModelFileError(
                f"{path}: tensor '{t.name}' has quant type {kind}, which kiln does not support "
                f"(supported: {', '.join(d.name for d in WEIGHT_DTYPES)}); re-quantize the model, e.g. to Q4_K_M or Q8_0"
            )
        shape = tuple(reversed(t.dims))
        offset = t.offset
        nbytes = dtype.nbytes(int(np.prod(shape)))
        if offset + nbytes > size:
            raise ModelFileError(
                f"{path}: truncated GGUF: tensor '{t.name}' ends at byte {offset + nbytes:,} but the file has "
                f"{size:,} bytes; fetch the file again"
            )
        tensors[t.name] = TensorInfo(t.name, dtype, shape, offset, nbytes)
    return tensors
