"""kiln perplexity: llama-perplexity's chunks against llama.cpp's logits, and the streamed mode."""
from __future__ import annotations

import json

import numpy as np
import pytest

import compiler
from compiler.tools import perplexity
from compiler.cli.main import main
from compiler.core.errors import OptionError
from reference import Reference

TEXT = perplexity.DEFAULT_TEXT.read_text()


def test_the_bundled_text_is_long_enough(smollm2):
    m = compiler.load(smollm2, ctx=64)
    assert len(m.tokenize(TEXT)) >= 8000
    assert "Project Gutenberg" in perplexity.DEFAULT_TEXT_SOURCE


def test_chunk_perplexity_agrees_with_llamacpp(smollm2):
    """The same chunks (first token BOS where the model adds one, second halves scored) read by
    llama.cpp through llama-cpp-python: the two perplexities within 1%."""
    ctx, text = 512, TEXT[:10000]  # about 2,600 tokens: 5 chunks
    kiln = compiler.load(smollm2, ctx=ctx, prefill_chunk=ctx)
    ref = Reference(smollm2, n_ctx=ctx, kv_dtype="f32")
    ours = perplexity.measure(kiln, text, "chunks")
    bos = kiln.spec.tokenizer.bos_id if kiln.spec.tokenizer.add_bos else None
    theirs = perplexity.chunks(ref.logits, ref.tokenize(text), ctx, bos)
    ppl = float(np.exp(theirs.mean()))
    print(f"\nSmolLM2 chunks of {ctx}: kiln {ours.ppl:.4f}, llama.cpp {ppl:.4f} over {theirs.size} tokens")
    assert ours.n_scored == theirs.size == len(kiln.tokenize(text)) // ctx * (ctx - 1 - ctx // 2)
    assert abs(ours.ppl / ppl - 1) < 0.01


def test_streaming_without_a_shift_is_one_prefill_bit_for_bit(smollm2):
    """A cache that holds the whole text never shifts, and reading it 7 tokens a step gives every
    token the logits of one prefill of the text (batch invariance), so the same NLL to the bit."""
    m = compiler.load(smollm2, ctx=512)
    ids = m.tokenize(TEXT)[:400]
    nll, shifts = perplexity.stream(m.default_sequence, ids, sinks=4, batch=7)
    m.reset()
    whole = perplexity.token_nll(m.prefill(ids, logits="all")[:-1], ids[1:])
    assert shifts == 0 and np.array_equal(nll, whole)


def test_streaming_shifts_and_scores_every_token(smollm2):
    m = compiler.load(smollm2, ctx=128)
    ids = m.tokenize(TEXT)[:600]
    nll, shifts = perplexity.stream(m.default_sequence, ids, sinks=4, batch=16)
    assert nll.size == 599 and shifts >= 6 and m.n_past <= 128 and np.isfinite(nll).all()


def test_cli_json_has_the_keys_tools_read(capsys, smollm2, tmp_path):
    text = tmp_path / "t.txt"
    text.write_text(TEXT[:3000])
    code = main(["perplexity", str(smollm2), "--ctx", "128", "--mode", "stream", "--sinks", "2",
                 "--text", str(text), "--json"])
    out = capsys.readouterr().out
    d = json.loads(out)
    assert code == 0 and set(d) >= {"mode", "ctx", "sinks", "kv_dtype_k", "kv_dtype_v", "n_scored", "ppl"}
    assert (d["mode"], d["ctx"], d["kv_dtype_k"], d["kv_dtype_v"]) == ("stream", 128, "f32", "f32") and d["ppl"] > 1


@pytest.mark.parametrize("argv,match", [
    (["--mode", "stream", "--sinks", "200"], "sinks"), (["--mode", "stream", "--batch", "0"], "--batch"),
    (["--text", "/nonexistent/t.txt"], "/nonexistent/t.txt"), (["--mode", "stream", "--discard", "0"], "--discard"),
])
def test_cli_errors_name_the_option(capsys, smollm2, argv, match):
    code = main(["perplexity", str(smollm2), *(["--ctx", "256"] if "--ctx" not in argv else []), *argv])
    assert code != 0 and match in capsys.readouterr().err


def test_chunks_need_one_whole_chunk(capsys, smollm2, tmp_path):
    with pytest.raises(OptionError, match="fewer than one chunk"):
        perplexity.chunk_inputs(list(range(10)), 16, None)
    short = tmp_path / "short.txt"
    short.write_text("Only a few words.")
    assert main(["perplexity", str(smollm2), "--ctx", "256", "--text", str(short)]) != 0
    assert "fewer than one chunk of ctx=256 (--ctx)" in capsys.readouterr().err


# -- heavy hitters (H2O) ---------------------------------------------------------------------------------
def test_attention_mass_is_each_querys_softmax_summed_and_leaves_logits_alone(smollm2):
    m = compiler.load(smollm2, ctx=256)
    ids = m.tokenize(TEXT)[:60]
    plain = m.prefill(ids, logits="all")
    m.reset()
    with pytest.raises(compiler.runtime.ModelError, match="track_attention"):
        m.default_sequence.attention_mass()
    m.track_attention(True)
    tracked = m.prefill(ids, logits="all")
    mass = m.default_sequence.attention_mass()
    hp = m.spec.hparams
    assert np.array_equal(plain, tracked)  # the bookkeeping reads the cache, it changes nothing
    assert mass.shape == (60,) and (mass >= 0).all()
    assert mass.sum() == pytest.approx(60 * hp.n_head * hp.n_layer, rel=1e-4)  # every query's weights sum to 1
    assert mass[0] > mass[1:].max()  # the first position is the attention sink
    keep = perplexity.h2o_keep(mass, 4, 30)
    m.default_sequence.keep(keep)
    assert np.array_equal(m.default_sequence.attention_mass(), mass[keep])


def test_h2o_keeps_sinks_recent_and_heavy_hitters():
    mass = np.array([9, 9, 1, 8, 1, 7, 1, 1, 1, 1, 1, 1], float)
    assert perplexity.h2o_keep(mass, 2, 8).tolist() == [0, 1, 2, 3, 5, 9, 10, 11]  # ties: the oldest


def test_h2o_is_refused_for_sliding_window_models(tiny, smollm2):
    from gguf import GGMLQuantizationType as Q
    path = tiny("gemma3", wtype=Q.Q8_0, n_layer=6, n_embd=128, n_head=4, n_head_kv=1, head_dim=64, n_ff=256,
                sliding_window=8, tokenizer_from=smollm2)
    with pytest.raises(OptionError, match="sliding-window"):
        perplexity.measure(compiler.load(path, ctx=64), TEXT[:2000], "stream", policy="h2o")
