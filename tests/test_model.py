"""The compiled model through its Python wrapper: chunking, cursor operations and refusals."""
from __future__ import annotations


import subprocess
import sys

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

import compiler
from compiler.core.errors import OptionError
from compiler.core.paths import RUNTIME_DIR
from compiler.runtime import Model, ModelError


@pytest.fixture(scope="module")
def tiny_llama(tiny):
    return tiny("llama", wtype=Q.Q8_0)


def _ids(n, vocab=259, seed=0):
    return np.random.default_rng(seed).integers(0, vocab, n)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_chunked_prefill_matches_token_by_token(tiny, arch):
    path = tiny(arch, wtype=Q.Q4_1)
    chunked = compiler.load(path, ctx=64, prefill_chunk=8)
    stepwise = compiler.load(path, ctx=64, prefill_chunk=8)
    ids = _ids(29)
    all_logits = chunked.prefill(ids, logits="all")
    assert all_logits.shape == (29, 259) and chunked.n_past == 29
    one_by_one = np.stack([stepwise.decode(int(t)) for t in ids])
    np.testing.assert_allclose(all_logits, one_by_one, rtol=1e-4, atol=1e-5)
    assert np.isfinite(all_logits).all()


def test_last_logits_equal_last_row_of_all(tiny_llama):
    a, b = compiler.load(tiny_llama, ctx=64, prefill_chunk=8), compiler.load(tiny_llama, ctx=64, prefill_chunk=8)
    ids = _ids(20, seed=1)
    np.testing.assert_array_equal(a.prefill(ids), b.prefill(ids, logits="all")[-1])


def test_rollback_and_reset_replay_identically(tiny_llama):
    m = compiler.load(tiny_llama, ctx=64, prefill_chunk=8)
    ids = _ids(30, seed=2)
    first = m.prefill(ids, logits="all")
    m.rollback(12)
    assert m.n_past == 12
    np.testing.assert_array_equal(m.prefill(ids[12:], logits="all"), first[12:])
    m.reset()
    assert m.n_past == 0
    np.testing.assert_array_equal(m.prefill(ids[:5], logits="all"), first[:5])


def test_instances_are_independent(tiny_llama):
    a, b = compiler.load(tiny_llama, ctx=64), compiler.load(tiny_llama, ctx=64)
    ids = _ids(10, seed=3)
    la = a.prefill(ids)
    b.prefill(_ids(7, seed=4))
    a.reset()
    np.testing.assert_array_equal(a.prefill(ids), la)
    assert (a.n_past, b.n_past) == (10, 7)


def test_refusals_leave_the_model_usable(tiny_llama):
    m = compiler.load(tiny_llama, ctx=16, prefill_chunk=8)
    m.prefill(_ids(10))
    with pytest.raises(ModelError, match=r"context full: the tokens do not fit in n_ctx=16 of sequence 0 \(n_past=10\)"):
        m.prefill(_ids(7))
    with pytest.raises(ModelError, match="token id 259 at index 1 is out of range"):
        m.prefill([3, 259])
    with pytest.raises(ModelError, match="out of range"):
        m.decode(-1)
    with pytest.raises(ModelError, match=r"rollback\(11\): sequence 0 holds n_past=10"):
        m.rollback(11)
    with pytest.raises(OptionError, match="logits must be 'last' or 'all'"):
        m.prefill([1], logits="some")
    assert m.n_past == 10
    m.prefill(_ids(6))  # exactly fills the context
    assert m.n_past == 16


def test_the_c_side_refuses_too(tiny_llama):
    m = compiler.load(tiny_llama, ctx=16)
    lib, ffi = m.instance.lib, m.instance.ffi
    out = ffi.new("float[]", 259 * 20)
    s = m.default_sequence.id
    assert lib.kiln_eval(m.instance.handle, s, ffi.new("int32_t[]", [1] * 17), 17, out, 1) == lib.KILN_E_CTX_FULL
    assert lib.kiln_eval(m.instance.handle, s, ffi.new("int32_t[]", [5, 999]), 2, out, 0) == lib.KILN_E_TOKEN
    assert lib.kiln_eval(m.instance.handle, s, ffi.NULL, 1, out, 0) == lib.KILN_E_ARG
    assert lib.kiln_eval(m.instance.handle, s + 1, ffi.new("int32_t[]", [5]), 1, out, 0) == lib.KILN_E_SEQ
    assert lib.kiln_seq_rollback(m.instance.handle, s, 1) == lib.KILN_E_ROLLBACK
    assert m.n_past == 0


def test_weights_file_must_match(tiny_llama, tmp_path):
    m = compiler.load(tiny_llama, ctx=16)
    other = tmp_path / "other.gguf"
    data = bytearray(tiny_llama.read_bytes())
    data[data.index(b"tiny-llama")] ^= 0x20  # same size, different header
    other.write_bytes(bytes(data))
    with pytest.raises(ModelError, match=r"other\.gguf: this is not the weights file the library was compiled for"):
        Model(m.compiled, other)
    shorter = tmp_path / "short.gguf"
    shorter.write_bytes(bytes(data[:-32]))
    with pytest.raises(ModelError, match="not the weights file"):
        Model(m.compiled, shorter)
    with pytest.raises(ModelError, match="cannot open"):
        Model(m.compiled, tmp_path / "missing.gguf")


def test_packed_weights_file_is_checked_and_optional(tiny_llama, tmp_path):
    """The library maps the x8 file the compiler wrote; a file written for other weights is
    refused by name; without one, the same library reads every weight from the GGUF."""
    from dataclasses import replace

    m = compiler.load(tiny_llama, ctx=16)
    if m.compiled.packed_path is None:
        pytest.skip("this build has no x8 kernel: nothing is packed")
    assert m.compiled.packed_path.read_bytes()[:8] == b"KILNX8\0\1"
    ids = _ids(6)
    packed_logits = m.prefill(ids, logits="all")

    foreign = tmp_path / "foreign.x8"
    data = bytearray(m.compiled.packed_path.read_bytes())
    data[16] ^= 1  # the GGUF header CRC it was written for
    foreign.write_bytes(bytes(data))
    with pytest.raises(ModelError, match=r"foreign\.x8: not the packed weights file for .*tiny-llama"):
        Model(replace(m.compiled, packed_path=foreign))
    with pytest.raises(ModelError, match="not the packed weights file"):
        Model(replace(m.compiled, packed_path=tmp_path / "missing.x8"))

    plain = Model(replace(m.compiled, packed_path=None))
    np.testing.assert_allclose(plain.prefill(ids, logits="all"), packed_logits, rtol=1e-4, atol=1e-4)


def test_second_load_reuses_the_build(tiny_llama):
    """A new process finds the build on disk (this one would find it in sys.modules): its load
    compiles nothing, and says the module it took was cached."""
    compiler.load(tiny_llama, ctx=24)
    code = ("import sys, compiler; from compiler.core.progress import LineProgress; "
            f"compiler.load({str(tiny_llama)!r}, ctx=24, log=LineProgress(True, sys.stdout))")
    again = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert again.returncode == 0, again.stderr
    assert "compiling" not in again.stdout and "cached: _kiln_model_" in again.stdout, again.stdout


def test_same_inputs_same_logits(tiny_llama):
    ids = _ids(25, seed=9)
    runs = [compiler.load(tiny_llama, ctx=64, prefill_chunk=8).prefill(ids, logits="all") for _ in range(2)]
    np.testing.assert_array_equal(*runs)



@pytest.mark.parametrize("arch", ["qwen2", "gemma3"])  # gemma3: window-8 layers, whose queries see different ranges
def test_threads_give_the_same_logits(tiny, arch):
    path = tiny(arch, wtype=Q.Q4_1, n_embd=128, n_head=4, n_head_kv=2, n_ff=256)
    ids = _ids(40, seed=11)
    runs = []
    for threads in (1, 2, 2, 3):
        m = compiler.load(path, ctx=64, prefill_chunk=16, threads=threads)
        assert m.n_threads == threads
        runs.append(np.vstack([m.prefill(ids[:30], logits="all"), m.prefill(ids[30:32], logits="all"),
                               *[m.decode(t)[None] for t in ids[32:]]]))
    for other in runs[1:]:
        np.testing.assert_array_equal(runs[0], other)  # each output is computed by one thread, in one order


def test_bad_thread_counts_are_refused(tiny_llama):
    with pytest.raises(OptionError, match="threads must be a positive integer"):
        compiler.load(tiny_llama, ctx=16, threads=0)


def test_the_build_key_names_the_cpu_the_library_is_built_for(monkeypatch):
    """A cache shared between hosts: a CPU with other ISA extensions gets another key, so it
    builds its own library instead of loading one that may use instructions it lacks."""
    from compiler.build import extension, targets
    from compiler.build.cc import header_cdef

    ext = extension.Extension("runtime", header_cdef(RUNTIME_DIR / "kernels.h"), '#include "kernels.h"')
    here = ext.key()
    assert "__SSE2__" in targets.target_identity(False)
    other_cpu = targets.target_identity(False) + "\n#define __AVX10_2__ 1"  # one more extension than this CPU has
    monkeypatch.setattr(extension, "target_identity", lambda sanitize, target="native", isa=(): other_cpu)
    assert ext.key() != here


def test_a_dropped_model_is_freed_at_once_not_at_the_next_collection(tiny, smollm2):
    """A Model holds its C instance (arena, KV pool, threads); it must go when its last reference
    does. A reference cycle (the model through its default sequence, or its constraint engine's
    tokenizer hook) would keep it until Python's next full collection, which a test suite or a
    notebook that loads model after model may not reach before memory runs out."""
    import gc
    import weakref

    gc.collect()
    gc.disable()
    try:
        m = compiler.load(tiny("llama", wtype=Q.Q8_0, tokenizer_from=smollm2), ctx=64, n_seq=2)
        m.prefill([1, 2, 3])  # the default sequence
        m.generate("ab", max_tokens=3, temperature=0, json_schema={"type": "object"})  # the constraint engine
        with m.sequence() as s:
            s.decode(4)
        del s  # a sequence of its own holds the model alive; its default one does not
        held = m.default_sequence
        alive = weakref.ref(m)
        del m
        assert alive() is None, "a dropped Model outlived its last reference (a reference cycle holds it)"
        with pytest.raises(ModelError, match="its model was dropped"):
            held.n_past
    finally:
        gc.enable()
