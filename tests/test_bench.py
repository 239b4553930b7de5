"""kiln bench runs both engines on the same file and reports medians and ratios (no timing asserted)."""
from __future__ import annotations

import json
import statistics

import pytest
from gguf import GGMLQuantizationType as Q

import compiler
from compiler.tools.bench import BenchTest, decode_bytes_per_token, default_tests
from compiler.cli.main import main


def test_bench_smoke(tiny, smollm2, tmp_path, capsys):
    path = tiny("llama", wtype=Q.Q8_0, n_embd=128, n_head=4, n_head_kv=2, n_ff=256, tokenizer_from=smollm2)
    out = tmp_path / "bench.json"
    assert main(["bench", str(path), "--threads", "1", "--reps", "1", "--pp", "16", "--tg", "4", "--depth", "8",
                 "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "pp16" in text and "tg4@d8" in text and "ratio" in text
    data = json.loads(out.read_text())
    assert [r["test"] for r in data["results"]] == ["pp16", "tg4", "tg4@d8"]
    for r in data["results"]:  # each figure is the median of its runs, and the ratio theirs
        assert len(r["kiln_runs"]) == 1 and set(r["llamacpp_runs"]) == {"fa off", "fa on"}
        assert r["kiln_tok_s"] == statistics.median(r["kiln_runs"])
        assert r["llamacpp_tok_s"] == max(statistics.median(v) for v in r["llamacpp_runs"].values())
        assert r["ratio"] == pytest.approx(r["kiln_tok_s"] / r["llamacpp_tok_s"])
    assert data["decode_bytes_per_token"] == decode_bytes_per_token(compiler.load(path, ctx=64))
    # beside the weights, the bound takes the K and V rows a decoded token reads: every layer's f32 rows of
    # its 2 kv heads of 32 values, for the p + 1 positions it sees, averaged over the timed tokens
    from gguf import GGUFReader
    per_position = int(GGUFReader(path).fields["llama.block_count"].parts[-1][0]) * 2 * 2 * 32 * 4
    assert data["decode_kv_bytes_per_token"] == {"tg4": per_position * (1 + 2 + 3 + 4) // 4,
                                                 "tg4@d8": per_position * (9 + 10 + 11 + 12) // 4}
    assert f"of K and V tg4 0.0 MB, tg4@d8 {data['decode_kv_bytes_per_token']['tg4@d8'] / 1e6:.1f} MB;" in text
    # the header names the kernels that ran; the bound is the C read kernel's, measured in each round of a
    # decode test and set against the runs of that round, numpy's figure beside it
    assert f"kiln's kernels: {data['kernels']}" in text and data["target"] == "native"
    assert "read_bw.c" in text and data["read_bandwidth_numpy_gb_s"] > 0
    for r in data["results"]:
        assert len(r["bandwidth_runs"]) == (0 if r["test"].startswith("pp") else 1)
        assert all(bw > 0 for bw in r["bandwidth_runs"])


def test_bench_takes_a_target_and_an_isa_switch(tiny, smollm2, tmp_path, capsys):
    from compiler.build.targets import missing_features

    if missing_features("x86-64-v3"):
        pytest.skip(f"this CPU lacks {missing_features('x86-64-v3')}")
    path = tiny("llama", wtype=Q.Q8_0, n_embd=128, n_head=4, n_head_kv=2, n_ff=256, tokenizer_from=smollm2)
    out = tmp_path / "bench.json"
    assert main(["bench", str(path), "--threads", "1", "--reps", "1", "--pp", "8", "--tg", "2", "--depth", "4",
                 "--target", "x86-64-v3", "--isa", "no-avx512", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    # without AVX-512 the x8 layout still runs, on its 256-bit kernel
    assert data["target"] == "x86-64-v3" and data["kernels"] == "AVX2 on the GGUF layout, AVX2 on the x8 layout"
    # --profile builds the same kiln (it had profiled the native build whatever was asked)
    assert main(["bench", str(path), "--profile", "--threads", "1", "--reps", "1", "--pp", "8",
                 "--target", "x86-64-v3", "--isa", "no-avx512", "--json", str(out)]) == 0
    prof = json.loads(out.read_text())
    assert (prof["target"], prof["kernel_paths"]) == ("x86-64-v3", "AVX2 on the GGUF layout, AVX2 on the x8 layout")
    assert "kiln's kernels: AVX2 on the GGUF layout, AVX2 on the x8 layout (target x86-64-v3, --isa no-avx512)" \
        in capsys.readouterr().out


@pytest.mark.parametrize("mode", [["--spec"], ["--embed"], ["--page-sizes", "16,64"]])
def test_a_bench_that_runs_the_native_build_only_refuses_a_target(mode, capsys):
    """--spec, --embed and --page-sizes load kiln's native build: a --target or --isa is refused by
    name, not silently left out."""
    for build in (["--target", "x86-64-v3"], ["--isa", "no-avx512"]):
        assert main(["bench", *mode, *build]) == 1
        assert f"kiln: error: {mode[0]} benches the native build only: --target and --isa" in capsys.readouterr().err


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
    assert list(sweep) == ["16", "64"] and all(set(row) == {"1024", "4096"} for row in sweep.values())


def test_batched_decode_against_llamacpp(tiny, smollm2, tmp_path, capsys):
    path = tiny("llama", wtype=Q.Q8_0, n_embd=128, n_head=4, n_head_kv=2, n_ff=256, tokenizer_from=smollm2)
    out = tmp_path / "batch.json"
    assert main(["bench", str(path), "--threads", "1", "--reps", "1", "--tg", "2", "--batch", "1,2",
                 "--batch-depth", "4", "--batch-only", "--json", str(out)]) == 0
    assert "batched decode" in capsys.readouterr().out
    rows = json.loads(out.read_text())["batched"]
    assert [r["batch"] for r in rows] == [1, 2]
    assert all(set(r["llamacpp_tok_s"]) == {"fa off", "fa on"} for r in rows)


def test_profile_counts_the_experts_multiply_adds(tiny, smollm2, capsys):
    """A mixture of experts' FFN is charged each row's chosen experts' three matrices, and counts
    among the int8 work against the peak (it was left out: half of a MoE prefill had no rate)."""
    from compiler.tools.profile import render, run_profile

    path = tiny("qwen3moe", wtype=Q.Q8_0, n_embd=128, n_head=4, n_head_kv=2, n_ff=64, n_expert=8, n_expert_used=2,
                tokenizer_from=smollm2)
    p = run_profile(str(path), 1, 24, 0, 1, "f32")
    moe = next(k for k in p.kernels if k.op == "moe_ffn")
    assert moe.int8 and moe.macs == 24 * 2 * 3 * 64 * 128 * 2  # rows, experts a row, matrices, n_ff x n_embd, layers
    assert p.int8_macs == moe.macs + sum(k.macs for k in p.kernels if k.op in ("matmul", "logits") and k.int8)
    assert "the quantized matmuls and experts:" in render(p)


def test_pp_at_depth_is_a_test():
    assert [t.name for t in default_tests(pp_depth=4096)] == ["pp512", "pp512@d4096", "tg128", "tg128@d1024"]
    assert default_tests(pp_depth=4096)[1] == BenchTest("pp512@d4096", 512, 0, 4096)


def test_profile_counts_every_op_and_multiply_add(tiny, smollm2, tmp_path, capsys):
    """kiln bench --profile on a tiny llama: every op of the prefill graph is charged, and the matmuls'
    multiply-adds are their shapes times the rows (no timing asserted)."""
    from compiler import load
    from compiler.core.errors import KilnError
    from compiler.ir.graph import Op
    from compiler.tools.profile import run_profile

    path = tiny("llama", wtype=Q.Q8_0, n_embd=128, n_head=4, n_head_kv=2, n_ff=256, tokenizer_from=smollm2)
    p = run_profile(str(path), 1, 40, 8, 1, "f32")
    m = load(path, ctx=49)
    g = m.compiled.planned.graph
    assert sum(k.count for k in p.kernels) == len(g.nodes)
    matmul_macs = sum(n.inputs[1].shape[0] * n.inputs[1].shape[1] * 40 * len(g.layers) for n in g.body
                      if n.op is Op.MATMUL)
    assert sum(k.macs for k in p.kernels if k.op == "matmul") == matmul_macs
    assert p.peak.macs_per_s > 0 and p.peak.isa != "none" and p.peak.exact_macs_per_s > 0
    # the tile peak is measured exactly where the kernels use tiles, and it is the higher one
    from compiler.build.runtime import runtime_kernels
    assert (p.peak.amx_macs_per_s is not None) == bool(runtime_kernels().lib.kiln_amx(-1))
    assert p.peak.amx_macs_per_s is None or p.peak.amx_macs_per_s > p.peak.macs_per_s
    # attention: each of 40 queries at positions 8..47 reads its causal history, for 4 heads of 32
    assert sum(k.macs for k in p.kernels if k.op == "attention") == 2 * 4 * 32 * sum(range(9, 49)) * 2
    with pytest.raises(KilnError, match="profile=True"):
        m.op_seconds()
    out = tmp_path / "profile.json"
    assert main(["bench", str(path), "--profile", "--threads", "1", "--reps", "1", "--pp", "16", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "matmul" in text and "q8_0" in text and "of peak" in text and "int8 peak" in text
    assert "the exact kernels' ceiling" in text
    assert ("AMX tile multiplies" in text) == (p.peak.amx_macs_per_s is not None)
    report = json.loads(out.read_text())
    assert report["int8_macs"] > 0 and report["peak"]["exact_macs_per_s"] > 0


def test_the_bound_is_measured_just_before_and_after_kilns_run(monkeypatch):
    """A round's bandwidth is read on either side of kiln's run, the higher taken, not at the round's
    end after the other engines: the VM's memory changes speed from minute to minute, and judged by
    another minute's figure kiln's decode had read 111% of its bound in one round. Engines and the
    bandwidth are stand-ins here, which log the order of the calls."""
    from types import SimpleNamespace

    from compiler.tools import bench, llamacpp

    calls = []

    class Engine:
        def __init__(self, name):
            self.name = name

        def run(self, t, tokens):
            calls.append(self.name)
            return 100.0

    m = SimpleNamespace(n_vocab=100, spec=SimpleNamespace(path="model.gguf", hparams=SimpleNamespace(n_expert=0)))
    monkeypatch.setattr(bench, "kiln_engine", lambda *a: (Engine("kiln"), m))
    monkeypatch.setattr(bench, "llamacpp_engine", lambda path, ctx, threads, kv, fa: Engine(f"llama {fa}"))
    monkeypatch.setattr(llamacpp, "flash_attn_settings", lambda kv: {"fa off": False, "fa on": True})
    rates = iter([30.0, 50.0, 60.0, 40.0])

    def bandwidth():
        calls.append("bw")
        return next(rates)

    tests = [BenchTest("pp8", 8, 0, 0), BenchTest("tg4", 0, 4, 0)]
    pp, tg = bench.run_bench("model.gguf", tests, threads=1, reps=2, bandwidth=bandwidth)
    round_ = ["bw", "kiln", "bw", "llama False", "llama True"]
    # pp's three rounds and tg's warm-up measure nothing; tg's counted rounds measure on either side of kiln
    assert calls == ["kiln", "llama False", "llama True"] * 4 + round_ * 2
    assert pp.bandwidth_runs == [] and tg.bandwidth_runs == [50.0, 60.0]
