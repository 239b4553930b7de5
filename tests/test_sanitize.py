"""The model library built with -fsanitize=address,undefined runs a generation and the refusals clean."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from gguf import GGMLQuantizationType as Q

from compiler.tools.synthetic_features import FEATURE_MODELS, FEATURE_SHAPE

SCRIPT = textwrap.dedent("""
    import sys
    import numpy as np
    import compiler
    from compiler.runtime import ModelError
    m = compiler.load(sys.argv[1], ctx=40, prefill_chunk=8, batch_tokens=12, kv_dtype=sys.argv[2], n_seq=3,
                      page_size=8, kv_pages=9, sanitize=True)
    ids = list(np.random.default_rng(0).integers(0, m.n_vocab, 21))
    logits = m.prefill(ids, logits="all")
    tok = int(logits[-1].argmax())
    for _ in range(10):
        tok = int(m.decode(tok).argmax())
    for bad in (lambda: m.prefill([1] * 20), lambda: m.decode(m.n_vocab), lambda: m.rollback(99)):
        try:
            bad()
            raise SystemExit("expected a refusal")
        except ModelError:
            pass
    # a mixed batch: forks share pages, rollbacks into shared pages copy on write, closed
    # sequences' pages are reused, and an exhausted pool is refused
    a = m.default_sequence
    b = a.fork()
    sliding = len(m.compiled.planned.layout.kv.groups) > 1
    b.rollback(0 if sliding else 13)  # into a shared page (a sliding window keeps nothing 18 back)
    c = m.sequence()
    c.prefill(ids[:5])
    for i in range(2):
        m.step([(a, 1 + i), (b, [2, 3, 4]), (c, 5)])
    for _ in range(2):  # c grows until the pool of 9 pages runs out, before its context does
        try:
            m.step([(c, list(range(12)))])
        except ModelError as e:
            assert "out of pages" in str(e), e
            break
    else:
        raise SystemExit("expected the pool to run out")
    b.close()
    c.rollback(2 if not sliding else c.n_past)
    m.step([(c, list(range(11))), (a, 7)])
    c.close()
    # a context shift of a sequence whose pages a fork shares, with H2O's bookkeeping on, an
    # arbitrary keep, and a state file written and read back
    m.reset()
    m.track_attention(True)
    f = a.fork()
    a.prefill((ids * 2)[:30])
    f.close()
    f = a.fork()
    a.shift(2, 10)
    try:
        a.keep([0, 1, 5, 12, 19])
    except ModelError as e:  # a sliding window of 8 cannot read rows it let go
        assert sliding and "sliding-window" in str(e), e
    assert a.attention_mass().shape == (a.n_past,)
    a.save(sys.argv[3])
    f.close()
    r = m.sequence_from(sys.argv[3])
    assert np.array_equal(r.decode(3), a.decode(3))
    r.close()
    m.track_attention(False)
    from compiler.build.runtime import runtime_kernels  # the sanitized build's SIMD kernels, for the log
    k = runtime_kernels(sanitize=True).lib
    print("simd", *(k.kiln_simd_kernels(t) for t in (0, 1, 2, 3, 6, 7, 8, 12, 13, 14)))
    m.reset()
    m.prefill([1] * 40)  # fills the context exactly
    lib, ffi = m.instance.lib, m.instance.ffi
    assert lib.kiln_eval(m.instance.handle, a.id, ffi.new("int32_t[]", [1]), 1, ffi.new("float[]", m.n_vocab), 0) == lib.KILN_E_CTX_FULL
    print("clean", m.n_past)
""")



def _libasan() -> str | None:
    try:
        path = subprocess.run(["cc", "-print-file-name=libasan.so"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return None
    return path if os.path.isabs(path) and os.path.exists(path) else None


def _feature(name: str, **kw) -> tuple[str, dict]:
    """A tiny model of compiler/tools/synthetic.py's FEATURE_MODELS, as (arch, TinySpec fields)."""
    spec = dict(FEATURE_SHAPE, **FEATURE_MODELS[name], **kw)
    return spec.pop("arch"), spec


CASES = {
    "llama-q4_1-f32": ("llama", dict(wtype=Q.Q4_1), "f32"),
    # K-quant weights, an f16 or q4_0 (Hadamard blocks) cache, sliding windows of 8 that move many times
    "gemma3-q4_k-q4_0": ("gemma3", dict(wtype=Q.Q4_K, n_layer=6, n_embd=256, n_head=4, n_head_kv=1, head_dim=64,
                                        n_ff=512, sliding_window=8), "q4_0"),
    "gemma3-q6_k-f16": ("gemma3", dict(wtype=Q.Q6_K, n_layer=6, n_embd=256, n_head=4, n_head_kv=1, head_dim=64,
                                       n_ff=512, sliding_window=8), "f16"),
    # soft-capped scores and logits beside sliding windows; fused row views with LongRoPE factors (the
    # shift reads them from the mapping); YaRN
    "gemma2-q8_0-q4_0": (*_feature("gemma2", wtype=Q.Q8_0), "q4_0"),
    "phi3-q8_0-f16": (*_feature("phi3-long", wtype=Q.Q8_0), "f16"),
    "qwen2-yarn-q4_0-q8_0": (*_feature("qwen2-yarn", wtype=Q.Q4_0), "q8_0"),
    # experts of K-quants with an up of another activation format, in their scratch's slots
    "qwen3moe-q4_k-f16": (*_feature("qwen3moe", wtype=Q.Q4_K, n_embd=256, n_ff=256, types={
        f"blk.{i}.ffn_up_exps.weight": Q.Q8_0 for i in range(2)}), "f16"),
}


@pytest.mark.parametrize("case", CASES)
def test_sanitized_generation_and_overflow(tiny, case, tmp_path):
    libasan = _libasan()
    if libasan is None:
        pytest.fail("the sanitizer test needs libasan (gcc's runtime); install gcc")
    arch, shape, kv_dtype = CASES[case]
    path = tiny(arch, **shape)
    env = {**os.environ, "LD_PRELOAD": libasan, "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=1",
           "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1"}
    r = subprocess.run([sys.executable, "-c", SCRIPT, str(path), kv_dtype, str(tmp_path / "state.kv")],
                       capture_output=True, text=True, env=env)
    assert r.returncode == 0 and "clean 40" in r.stdout, r.stderr[-3000:]
    # the sanitized library runs the same SIMD kernels as the real build (dots, dequantizers, gemms)
    from compiler.build.runtime import runtime_kernels
    lib = runtime_kernels().lib
    simd = [int(x) for x in r.stdout.split("simd ")[1].split()[:10]]
    assert simd == [lib.kiln_simd_kernels(t) for t in (0, 1, 2, 3, 6, 7, 8, 12, 13, 14)]
    print(f"\n{case}: sanitized SIMD kernels per type (f32 f16 q4_0 q4_1 q5_0 q5_1 q8_0 q4_K q5_K q6_K): {simd}")
    assert "runtime error" not in r.stderr and "AddressSanitizer" not in r.stderr
