"""kiln kv-quality: each KV dtype against the f32 cache, and what it saves."""
from __future__ import annotations

import json

from gguf import GGMLQuantizationType as Q

from compiler.cli import main
from compiler.kv_quality import measure


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
