"""Token ids identical to llama.cpp's on a varied corpus, in both flag combinations."""
from __future__ import annotations

import pytest

from compiler.frontend.gguf_reader import read_model
from compiler.text.tokenizer import make_tokenizer
from reference import Reference
from tokenizer_corpus import corpus

FLAGS = [(True, True), (False, False)]


def _mismatches(tok, ref, texts):
    bad = []
    for text in texts:
        for add, special in FLAGS:
            ours, theirs = tok.tokenize(text, add, special), ref.tokenize(text, add, special)
            if ours != theirs:
                bad.append((text, add, special, ours, theirs))
    return bad


def test_corpus_is_varied():
    texts = corpus()
    assert len(texts) >= 200
    joined = "".join(texts)
    for needle in ("\r\n", "\t", "  ", "日本", "مرحبا", "\u200d", "https://", "<|im_start|>", "def ", "12345"):
        assert needle in joined


def test_smollm2_matches_llamacpp(smollm2):
    tok = make_tokenizer(read_model(smollm2).tokenizer)
    bad = _mismatches(tok, Reference(smollm2, n_ctx=64), corpus())
    assert not bad, f"{len(bad)} mismatches, first: {bad[:3]}"


def test_gemma3_sentencepiece_matches_llamacpp(gemma3):
    tok = make_tokenizer(read_model(gemma3).tokenizer)
    texts = corpus() + ["<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n", "<b>bold</b> and </s>"]
    bad = _mismatches(tok, Reference(gemma3, n_ctx=64), texts)
    assert not bad, f"{len(bad)} mismatches, first: {bad[:3]}"
    assert tok.tokenize("Hello", add_special=True)[0] == 2  # the GGUF asks for BOS


@pytest.mark.parametrize("text", [t for t in corpus() if "<" not in t][:60])
def test_gemma3_detokenize_round_trips(gemma3, text):
    tok = make_tokenizer(read_model(gemma3).tokenizer)
    assert tok.detokenize(tok.tokenize(text, add_special=False, parse_special=False)) == text


def test_qwen2_pre_tokenizer_matches_llamacpp(tiny, smollm2):
    # SmolLM2's vocabulary behind the qwen2 pre-tokenizer: llama.cpp splits with its qwen2 regex
    path = tiny("qwen2", tokenizer_from=smollm2, tokenizer_pre="qwen2")
    tok = make_tokenizer(read_model(path).tokenizer)
    bad = _mismatches(tok, Reference(path, n_ctx=64), corpus())
    assert not bad, f"{len(bad)} mismatches, first: {bad[:3]}"


@pytest.mark.parametrize("text", [t for t in corpus() if "<|" not in t and "<" not in t][:80])
def test_detokenize_round_trips(smollm2, text):
    tok = make_tokenizer(read_model(smollm2).tokenizer)
    assert tok.detokenize(tok.tokenize(text, add_special=False, parse_special=False)) == text


LONG_WORDS = ["a" * 20_000, "ab" * 8_000, "hello" * 3_000 + " world", "1234567890" * 1_500, "日本語" * 3_000]


@pytest.mark.parametrize("model", ["smollm2", "gemma3"])
def test_long_words_merge_as_llamacpps(model, request):
    """One pre-token of thousands of symbols (the server's old quadratic case): the heap merge gives
    llama.cpp's ids, and a 200,000-character word is merged in bounded time."""
    import time

    path = request.getfixturevalue(model)
    tok = make_tokenizer(read_model(path).tokenizer)
    ref = Reference(path, n_ctx=64)
    for text in LONG_WORDS:
        assert tok.tokenize(text, False, False) == ref.tokenize(text, False, False), text[:20]
    t0 = time.monotonic()
    tok.tokenize("a" * 200_000, False, False)
    assert time.monotonic() - t0 < 60  # a bound on the wait, not a timing: quadratic took hours at 1 MB
