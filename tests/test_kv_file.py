"""KV state files: seq.save(path) / m.sequence_from(path), bit for bit, and their refusals."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

import compiler
from compiler.tools.kv_quality import DEFAULT_TEXT
from compiler.runtime.kv_file import KVFileError

TEXT = DEFAULT_TEXT.read_text()


@pytest.fixture(scope="module")
def smol_q8(smollm2):
    return compiler.load(smollm2, ctx=512, n_seq=3, kv_dtype="q8_0")


@pytest.fixture(scope="module")
def saved(smol_q8, tmp_path_factory):
    m = smol_q8
    path = tmp_path_factory.mktemp("kv") / "seq.kv"
    with m.sequence() as s:
        s.prefill(m.tokenize(TEXT)[:300])
        s.save(path)
    return path


def test_a_restored_sequence_gives_the_live_ones_logits_bit_for_bit(smol_q8, smollm2, tmp_path):
    m = smol_q8
    ids = m.tokenize(TEXT)[:300]
    live = m.sequence()
    live.prefill(ids)
    size = live.save(tmp_path / "a.kv")
    assert size == (tmp_path / "a.kv").stat().st_size and not list(tmp_path.glob(".*tmp"))
    back = m.sequence_from(tmp_path / "a.kv")
    assert back.n_past == 300 and back.tokens == ids
    assert np.array_equal(live.decode(ids[5]), back.decode(ids[5]))
    live.close(), back.close()
    other = compiler.load(smollm2, ctx=512, n_seq=3, kv_dtype="q8_0")  # another instance of the library
    with other.sequence_from(tmp_path / "a.kv") as s, other.sequence() as fresh:
        fresh.prefill(ids)
        assert np.array_equal(s.decode(ids[5]), fresh.decode(ids[5]))


def test_sliding_window_state_round_trips(tiny, smollm2, tmp_path):
    """Gemma-style layers with a window of 8: the sliding group holds only its window's pages,
    and the file records which."""
    path = tiny("gemma3", wtype=Q.Q8_0, n_layer=6, n_embd=128, n_head=4, n_head_kv=1, head_dim=64, n_ff=256,
                sliding_window=8, tokenizer_from=smollm2)
    m = compiler.load(path, ctx=128, page_size=8, n_seq=2, kv_dtype="q4_0")
    ids = [int(t) for t in np.random.default_rng(1).integers(10, 4000, 90)]
    with m.sequence() as s:
        s.prefill(ids)
        s.save(tmp_path / "g.kv")
        want = s.decode(7)
    with m.sequence_from(tmp_path / "g.kv") as s:
        assert np.array_equal(s.decode(7), want)


def _corrupt(src: Path, dst: Path, at: int) -> Path:
    data = bytearray(src.read_bytes())
    data[at] ^= 0x40
    dst.write_bytes(bytes(data))
    return dst


@pytest.mark.parametrize("case,match", [
    ("f16", "kv_dtype_k is 'q8_0' in the file, 'f16' here"),
    ("page", "page_size"),
    ("gemma", "another model"),
    ("flip", "checksum"),
    ("truncate", "checksum|truncated"),
    ("foreign", "not a kiln KV state file"),
    ("missing", "cannot read"),
    ("ctx", "n_ctx=128"),
])
def test_a_file_for_something_else_is_refused_by_name(saved, smollm2, gemma3, tmp_path, case, match):
    path = saved
    if case == "flip":
        path = _corrupt(saved, tmp_path / "flip.kv", saved.stat().st_size - 100)
    elif case == "truncate":
        path = tmp_path / "short.kv"
        path.write_bytes(saved.read_bytes()[:-1000])
    elif case == "foreign":
        path = tmp_path / "x.kv"
        path.write_bytes(b"GGUF" + bytes(100))
    elif case == "missing":
        path = tmp_path / "nope.kv"
    kw = {"f16": dict(kv_dtype="f16"), "page": dict(kv_dtype="q8_0", page_size=32), "ctx": dict(kv_dtype="q8_0", ctx=128)}
    model = gemma3 if case == "gemma" else smollm2
    m = compiler.load(model, **{"ctx": 512, "kv_dtype": "q8_0", **kw.get(case, {})})
    with pytest.raises(KVFileError, match=match) as e:
        m.sequence_from(path)
    assert str(path) in str(e.value)
    assert m.kv_stats()["sequences"] == 0  # nothing was left open


def test_a_full_pool_refuses_the_state_and_changes_nothing(saved, smollm2):
    m = compiler.load(smollm2, ctx=512, kv_dtype="q8_0", n_seq=2, kv_pages=8)
    with m.sequence() as s:
        s.prefill(m.tokenize(TEXT)[:300])  # 5 of 8 pages
        with pytest.raises(KVFileError, match="out of pages"):
            m.sequence_from(saved)
        assert m.kv_stats()["pages_used"] == 5 and m.kv_stats()["sequences"] == 1
