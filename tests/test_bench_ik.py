"""ik_llama.cpp as kiln's third engine (compiler/tools/ik_llama.py): its tools' output parsed as they print it
(captured from real runs into tests/data/ik_llama/, see its README), the command line each test kind and
setting builds, what a missing build and a bad path do, and one slow run of kiln bench with all three
engines (no timing asserted, only that each engine ran)."""
from __future__ import annotations

import json
import statistics
from dataclasses import asdict
from pathlib import Path

import pytest

from compiler.cli.main import main
from compiler.core.errors import OptionError
from compiler.tools import ik_llama
from compiler.tools.bench import BenchResult, BenchTest, render

DATA = Path(__file__).parent / "data" / "ik_llama"


def _fake_tool(directory: Path, name: str, body: str) -> Path:
    """An executable standing in for an ik tool: a shell script (it prints a captured output, or fails)."""
    directory.mkdir(parents=True, exist_ok=True)
    p = directory / name
    p.write_text("#!/bin/sh\n" + body + "\n")
    p.chmod(0o755)
    return p


# --- the parsers, on what the real tools printed --------------------------------------------------------------

@pytest.mark.parametrize("name,n_prompt,n_gen,repack", [("llama-bench-pp16.json", 16, 0, False),
                                                        ("llama-bench-tg4.json", 0, 4, False),
                                                        ("llama-bench-tg4-at-8.json", 8, 4, True)])
def test_llama_bench_json(name, n_prompt, n_gen, repack):
    rows = ik_llama.parse_bench_json((DATA / name).read_text())
    assert len(rows) == 1
    r = rows[0]
    # the test it says it ran (-gp D,N reports n_prompt D, n_gen N), and avg_ts, the figure taken, is the
    # mean of its samples' tok/s, each tokens timed over the sample's time
    assert (r["n_prompt"], r["n_gen"], r["repack"], r["flash_attn"]) == (n_prompt, n_gen, repack, True)
    assert r["avg_ts"] > 0 and r["avg_ts"] == pytest.approx(statistics.mean(r["samples_ts"]), rel=1e-5)
    timed = n_prompt if not n_gen else n_gen  # -gp times the decodes only
    assert r["samples_ts"][0] == pytest.approx(timed * 1e9 / r["samples_ns"][0], rel=1e-5)
    assert isinstance(r["build_number"], int) and r["build_commit"]


def test_llama_bench_json_after_other_output_and_garbage():
    text = (DATA / "llama-bench-pp16.json").read_text()
    assert ik_llama.parse_bench_json("a line a tool printed first\n" + text)[0]["n_prompt"] == 16
    for bad in ("", "usage: llama-bench [options]", "[\n  {\n", "[]"):
        with pytest.raises(ik_llama.IkError):
            ik_llama.parse_bench_json(bad)


def test_batched_bench_table():
    text = (DATA / "llama-batched-bench.txt").read_text()
    got = ik_llama.parse_batched(text)
    assert sorted(got) == [1, 2]
    # S_TG, the column taken, is B * TG / T_TG of its own row, read here by splitting the row afresh
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 10 and cells[0].isdigit():
            pp, tg, b, t_tg, s_tg = int(cells[0]), int(cells[1]), int(cells[2]), float(cells[6]), float(cells[7])
            assert (pp, tg) == (8, 4) and got[b] == s_tg
            assert s_tg == pytest.approx(b * tg / t_tg, rel=0.03)  # T_TG is printed to the millisecond
    with pytest.raises(ik_llama.IkError):
        ik_llama.parse_batched("main: n_kv_max = 256\n")


def test_version_line(tmp_path):
    v = (DATA / "version.txt").read_text()
    p = _fake_tool(tmp_path, "llama-server", f"cat '{DATA / 'version.txt'}' >&2")  # common's --version: stderr
    got = ik_llama.version(p)
    assert isinstance(got["build_number"], int) and got["build_commit"] in v


# --- the command lines ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("test,want", [(BenchTest("pp512", 512, 0, 0), ["-p", "512", "-n", "0"]),
                                       (BenchTest("tg128", 0, 128, 0), ["-p", "0", "-n", "128"]),
                                       (BenchTest("tg128@d1024", 0, 128, 1024), ["-p", "0", "-n", "0", "-gp",
                                                                                "1024,128"])])
@pytest.mark.parametrize("repack", [False, True])
def test_llama_bench_argv(test, want, repack):
    argv = ik_llama.bench_argv("/ik/llama-bench", "/m.gguf", test.n_prompt, test.n_gen, test.depth, 2, "q8_0",
                               repack, moe=False)
    assert argv[:3] == ["/ik/llama-bench", "-m", "/m.gguf"] and argv[3:3 + len(want)] == want
    rest = argv[3 + len(want):]
    assert rest == ["-r", "1", "-o", "json", "-t", "2", "-fa", "1", "-ctk", "q8_0", "-ctv", "q8_0",
                    "-rtr", "1" if repack else "0"]


def test_llama_bench_argv_moe_and_f32():
    argv = ik_llama.bench_argv("b", "m", 16, 0, 0, 1, "f32", False, moe=True)
    assert argv[-2:] == ["-fmoe", "1"]
    assert argv[argv.index("-ctk") + 1] == argv[argv.index("-ctv") + 1] == "f16"  # llama-bench knows no f32 cache
    with pytest.raises(ik_llama.IkError, match="no pp at depth"):
        ik_llama.bench_argv("b", "m", 512, 0, 1024, 1, "f16", False, moe=False)


def test_batched_and_server_argv():
    argv = ik_llama.batched_argv("/ik/llama-batched-bench", "/m.gguf", [1, 8], 128, 32, 2, "f16", repack=True)
    assert argv[argv.index("-c") + 1] == str(8 * (128 + 32) + 64)
    assert [argv[argv.index(f) + 1] for f in ("-npp", "-ntg", "-npl", "-fa", "-t", "-tb")] == \
        ["128", "32", "1,8", "on", "2", "2"]
    assert argv[-1] == "-rtr" and "-pps" not in argv  # a bare switch in common's options; prompts not shared
    assert "-rtr" not in ik_llama.batched_argv("b", "m", [1], 8, 4, 1, "f16", repack=False)
    s = ik_llama.server_argv("/ik/llama-server", "/m.gguf", "smollm2", 8080, 8, 1024, 2, "f16")
    assert [s[s.index(f) + 1] for f in ("--alias", "--port", "--parallel", "-c", "-ctk", "-fa", "--webui")] == \
        ["smollm2", "8080", "8", str(8 * 1024), "f16", "on", "none"]
    assert "--no-webui" not in s and "-rtr" not in s  # ik's server has no --no-webui
    assert ik_llama.server_argv("b", "m", "a", 1, 1, 64, 1, "f16", repack=True)[-1] == "-rtr"


def test_flash_attention_off_where_many_sequences_abort_it(tmp_path):
    assert ik_llama.batched_argv("b", "m", [2], 8, 4, 1, "f16", False, flash_attn=False)[-6:-4] == ["-fa", "off"]
    assert "off" in ik_llama.server_argv("b", "m", "a", 1, 2, 64, 1, "f16", flash_attn=False)
    # the probe: one token each of two sequences in one batch; ik 0.1.5 aborts (SIGABRT: 134 from a shell)
    aborts = _fake_tool(tmp_path / "a", "llama-batched-bench", "echo 'GGML_ASSERT(S > 0) failed' >&2; kill -ABRT $$")
    assert not ik_llama.multi_seq_flash_attn(aborts, "m", 1)
    assert ik_llama.multi_seq_flash_attn(_fake_tool(tmp_path / "b", "llama-batched-bench", "exit 0"), "m", 1)
    probe = ik_llama.probe_argv("b", "m", 2)
    assert [probe[probe.index(f) + 1] for f in ("-npp", "-ntg", "-npl", "-fa")] == ["1", "1", "2", "on"]


# --- finding the tools --------------------------------------------------------------------------------------------

def test_none_leaves_ik_out():
    assert ik_llama.find("none", "llama-bench") is None


def test_a_bad_explicit_path_is_an_error_naming_the_option(tmp_path):
    with pytest.raises(OptionError, match=r"^--ik .*nope: no such file or directory"):
        ik_llama.find(str(tmp_path / "nope"), "llama-bench")
    with pytest.raises(OptionError, match=r"^--ik-server .*: no runnable llama-server at"):
        ik_llama.find(str(tmp_path), "llama-server", option="--ik-server")


def test_an_explicit_directory_or_tool(tmp_path):
    bench = _fake_tool(tmp_path / "bin", "llama-bench", "exit 0")
    server = _fake_tool(tmp_path / "bin", "llama-server", "exit 0")
    assert ik_llama.find(str(tmp_path / "bin"), "llama-bench") == bench
    assert ik_llama.find(str(bench), "llama-server") == server  # a tool names its directory
    assert ik_llama.find(str(server), "llama-server", option="--ik-server") == server


def test_the_environment_names_a_bin_directory(tmp_path, monkeypatch):
    bench = _fake_tool(tmp_path / "bin", "llama-bench", "exit 0")
    monkeypatch.setenv(ik_llama.ENV, str(tmp_path / "bin"))
    assert ik_llama.find(None, "llama-bench") == bench
    with pytest.raises(OptionError, match=r"^\$KILN_IK_LLAMA="):
        ik_llama.find("auto", "llama-batched-bench")


@pytest.mark.parametrize("target,bin_dir,make", [("native", "bin", "make ik-llama"),
                                                 ("x86-64-v3", "bin-avx2", "make ik-llama-avx2")])
def test_a_missing_build_is_one_line(tmp_path, monkeypatch, target, bin_dir, make):
    monkeypatch.delenv(ik_llama.ENV, raising=False)
    monkeypatch.setattr(ik_llama, "ROOT", tmp_path)
    lines: list[str] = []
    assert ik_llama.find(None, "llama-bench", target, log=lines.append) is None
    assert len(lines) == 1 and f"`{make}`" in lines[0]
    assert str(tmp_path / "build" / "ik-llama" / bin_dir / "llama-bench") in lines[0]


def test_kiln_bench_with_a_bad_ik_path_stops_before_running(tmp_path, capsys):
    assert main(["bench", "--ik", str(tmp_path / "nope"), "--reps", "1"]) == 1
    assert f"kiln: error: --ik {tmp_path / 'nope'}: no such file or directory" in capsys.readouterr().err


# --- the engine and the table ---------------------------------------------------------------------------------------

def test_the_engine_runs_one_process_a_round(tmp_path):
    bench = _fake_tool(tmp_path, "llama-bench", f"cat '{DATA / 'llama-bench-tg4-at-8.json'}'")
    runner = ik_llama.Runner(bench)
    engines = ik_llama.bench_engines(runner, "/m.gguf", 2, "f16", moe=False)
    assert list(engines) == ["rtr off", "rtr on"]
    want = json.loads((DATA / "llama-bench-tg4-at-8.json").read_text())[0]
    assert engines["rtr on"].run(BenchTest("tg4@d8", 0, 4, 8)) == want["avg_ts"]
    d = runner.describe()
    assert d["sdist"] == ik_llama.SDIST and d["build_commit"] == want["build_commit"]
    assert d["commands"] == {"tg4@d8 rtr on": f"{bench} -m /m.gguf -p 0 -n 0 -gp 8,4 -r 1 -o json -t 2 -fa 1 "
                                              "-ctk f16 -ctv f16 -rtr 1"}


def test_a_failing_tool_says_why(tmp_path):
    bench = _fake_tool(tmp_path, "llama-bench", "echo 'llama_model_load: error loading model: unknown "
                                                "architecture' >&2; exit 1")
    with pytest.raises(ik_llama.IkError, match="exited with 1: .*unknown architecture"):
        ik_llama.BenchEngine(ik_llama.Runner(bench), "m", 1, "f16", False, False).run(BenchTest("tg4", 0, 4, 0))


def _result(ik: dict[str, list[float]] | None) -> BenchResult:
    ik = ik or {}
    best = max((statistics.median(v) for v in ik.values()), default=None)
    return BenchResult("tg4", 100.0, 50.0, 2.0, [100.0], {"fa off": [50.0], "fa on": [40.0]}, [20.0], ik, best,
                       100.0 / best if best else None)


def test_the_table_shows_both_ratios_and_each_share_of_the_bound():
    with_ik = render([_result({"rtr off": [80.0], "rtr on": [125.0]})], "m", 2, 100_000_000, ik_note="ik held f16")
    assert "vs ik = kiln / the faster ik_llama.cpp" in with_ik and "ik held f16" in with_ik
    assert "ik rtr off" in with_ik and "ik rtr on" in with_ik and with_ik.split("\n")[3].split()[-2:] == ["2.00x",
                                                                                                          "0.80x"]
    assert "llama.cpp at 25%, ik_llama.cpp at 62%" in with_ik  # 125 tok/s * 100 MB over 20 GB/s
    without = render([_result(None)], "m", 2, 100_000_000, ik_note="ik held f16")
    assert not any(w in without for w in ("vs ik", "ik rtr", "ik_llama", "ik held"))  # two engines: as before


def test_docs_figures_show_ik_where_a_run_had_it():
    from compiler.tools.docs_figures import _batch, _bench

    doc = {"results": [asdict(_result({"rtr off": [80.0], "rtr on": [125.0]}))]}
    rows = _bench(doc)
    assert rows[0].endswith("| ik rtr off | ik rtr on | kiln / the faster ik |") and rows[1].count("---") == 8
    assert rows[2] == "| tg4 | 100.0 | 50.0 | 40.0 | 2.00x | 80.0 | 125.0 | 0.80x |"
    batch = {"batched": [{"batch": 1, "kiln_tok_s": 10.0, "llamacpp_tok_s": {"fa on": 5.0}, "ratio": 2.0,
                          "ik_tok_s": {"rtr off": 4.0, "rtr on": 8.0}, "ik_ratio": 1.25}]}
    assert _batch(batch)[2] == "| 1 | 10.0 | 1.00x | 5.0 | 2.00x | 4.0 | 8.0 | 1.25x |"


# --- the real thing ---------------------------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.llamacpp
def test_kiln_bench_runs_three_engines(smollm2, tmp_path, capsys, monkeypatch):
    if not (ik_llama.default_bin_dir() / "llama-bench").is_file():
        pytest.skip(f"{ik_llama.default_bin_dir() / 'llama-bench'} is missing: `make ik-llama` builds it "
                    "(about 15 minutes)")
    monkeypatch.delenv(ik_llama.ENV, raising=False)  # the build kiln finds by itself
    out = tmp_path / "bench.json"
    assert main(["bench", str(smollm2), "--threads", "1", "--reps", "1", "--pp", "16", "--tg", "4", "--depth", "8",
                 "--kv-dtype", "f16", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "ik rtr off" in text and "vs ik" in text
    data = json.loads(out.read_text())
    for r in data["results"]:
        assert r["kiln_tok_s"] > 0 and all(v[0] > 0 for v in r["llamacpp_runs"].values())
        assert set(r["ik_runs"]) == {"rtr off", "rtr on"}
        assert all(len(v) == 1 and v[0] > 0 for v in r["ik_runs"].values())
        assert r["ik_tok_s"] == max(v[0] for v in r["ik_runs"].values())
    ik = data["provenance"]["engines"]["ik_llama.cpp"]
    # make ik-llama writes the sdist's name as the build's commit (its tree has no git history to name)
    assert ik["sdist"] == ik_llama.SDIST and ik["build_commit"] == ik_llama.SDIST.replace(" ", "-")
    assert " -gp 8,4 " in ik["commands"]["tg4@d8 rtr on"] and ik["kv_dtype"] == "f16"
