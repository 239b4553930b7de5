"""kiln kv-quality: each KV dtype against the f32 cache, and what it saves."""
from __future__ import annotations

import json

import pytest

from gguf import GGMLQuantizationType as Q

from compiler.cli.main import main
from compiler.tools.kv_quality import measure


def test_measure_on_a_small_model(tiny, smollm2):
    path = tiny("llama", wtype=Q.Q8_0, n_embd=128, n_head=4, n_head_kv=2, n_ff=256, tokenizer_from=smollm2)
    rows = measure(path, ["f16", "q8_0"], "The quick brown fox jumps over the lazy dog. " * 20, ctx=256)
    f32, f16, q8 = rows
    assert f32.positions == f16.positions > 100
    assert f16.saved_bytes == f32.kv_bytes // 2
    assert q8.kv_bytes == f32.kv_bytes * 34 // 128  # 34 bytes per 32 values instead of 128
    assert 0 <= f16.mean_kl < q8.mean_kl < 1e-2  # f16 rounds less than q8_0
    assert f16.top1 >= 0.95 and q8.top1 >= 0.9


def test_cli_json_and_errors(tiny, smollm2, tmp_path, capsys):
    path = tiny("llama", wtype=Q.Q8_0, n_embd=128, n_head=4, n_head_kv=2, n_ff=256, tokenizer_from=smollm2)
    text = tmp_path / "t.txt"
    text.write_text("one two three four five six seven eight nine ten " * 6)
    assert main(["kv-quality", str(path), "--kv-dtype", "q8_0", "--text", str(text), "--ctx", "128", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["dtype"] for r in rows] == ["f32", "q8_0"] and rows[1]["saved_bytes"] > 0
    assert main(["kv-quality", str(path), "--kv-dtype", "q4"]) == 1
    assert "unknown KV cache dtype 'q4'" in capsys.readouterr().err
    assert main(["kv-quality", str(path), "--text", str(tmp_path / "missing.txt")]) == 1
    assert "missing.txt: cannot read it" in capsys.readouterr().err


def test_pairs_perplexity_and_llamacpp_side_by_side(tiny, smollm2):
    """K and V types apart ('q8_0/q4_0'), each cache's perplexity and its change from f32, and
    llama.cpp's caches of the same types measured the same way against its own f32 cache."""
    path = tiny("llama", wtype=Q.Q8_0, n_embd=128, n_head=2, n_head_kv=1, n_ff=256, tokenizer_from=smollm2)
    rows = measure(path, ["q8_0/q4_0"], "The quick brown fox jumps over the lazy dog. " * 20, ctx=256, llamacpp=True)
    assert [(r.engine, r.dtype) for r in rows] == [("kiln", "f32"), ("kiln", "q8_0/q4_0"), ("llama.cpp", "f32"),
                                                   ("llama.cpp", "q8_0/q4_0")]
    kiln_f32, kiln_q, ll_f32, ll_q = rows
    assert kiln_q.kv_bytes == kiln_f32.kv_bytes * (34 + 18) // 256 == ll_q.kv_bytes
    assert kiln_f32.ppl > 1 and kiln_q.delta_ppl == pytest.approx(kiln_q.ppl - kiln_f32.ppl)
    assert abs(kiln_f32.ppl / ll_f32.ppl - 1) < 0.01  # the two engines read the text alike
    assert 0 < kiln_q.mean_kl < 0.05 and 0 < ll_q.mean_kl < 0.05
