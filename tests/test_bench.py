"""kiln bench runs both engines on the same file and reports medians and ratios (no timing asserted)."""
from __future__ import annotations

import json

from gguf import GGMLQuantizationType as Q

from compiler.bench import BenchTest, default_tests
from compiler.cli import main


def test_bench_smoke(tiny, smollm2, tmp_path, capsys):
    path = tiny("llama", wtype=Q.Q8_0, n_embd=128, n_head=4, n_head_kv=2, n_ff=256, tokenizer_from=smollm2)
    out = tmp_path / "bench.json"
    assert main(["bench", str(path), "--threads", "1", "--reps", "1", "--pp", "16", "--tg", "4", "--depth", "8",
                 "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "pp16" in text and "tg4@d8" in text and "ratio" in text
    data = json.loads(out.read_text())
    assert [r["test"] for r in data["results"]] == ["pp16", "tg4", "tg4@d8"]
    assert all(r["kiln_tok_s"] > 0 and r["llamacpp_tok_s"] > 0 for r in data["results"])
    assert data["decode_bytes_per_token"] > 0


def test_default_tests_follow_llama_bench():
    assert [t.name for t in default_tests()] == ["pp512", "tg128", "tg128@d1024"]
    assert default_tests()[2] == BenchTest("tg128@d1024", 0, 128, 1024)


def test_page_size_sweep(tiny, smollm2, tmp_path, capsys):
    path = tiny("llama", wtype=Q.Q8_0, n_embd=64, n_head=2, n_head_kv=1, n_ff=128, n_layer=1, tokenizer_from=smollm2)
    out = tmp_path / "pages.json"
    assert main(["bench", str(path), "--threads", "1", "--reps", "1", "--tg", "2", "--page-sizes", "16,64",
                 "--json", str(out)]) == 0
    assert "page size sweep" in capsys.readouterr().out
    sweep = json.loads(out.read_text())["page_sizes"]
    assert list(sweep) == ["16", "64"] and all(set(row) == {"1024", "4096"} and min(row.values()) > 0
                                               for row in sweep.values())


def test_batched_decode_against_llamacpp(tiny, smollm2, tmp_path, capsys):
    path = tiny("llama", wtype=Q.Q8_0, n_embd=128, n_head=4, n_head_kv=2, n_ff=256, tokenizer_from=smollm2)
    out = tmp_path / "batch.json"
    assert main(["bench", str(path), "--threads", "1", "--reps", "1", "--tg", "2", "--batch", "1,2",
                 "--batch-depth", "4", "--batch-only", "--json", str(out)]) == 0
    assert "batched decode" in capsys.readouterr().out
    rows = json.loads(out.read_text())["batched"]
    assert [r["batch"] for r in rows] == [1, 2]
    assert all(r["kiln_tok_s"] > 0 and set(r["llamacpp_tok_s"]) == {"fa off", "fa on"} for r in rows)
