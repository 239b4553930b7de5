"""kiln's Unigram ("t5") tokenizer against llama.cpp's (llama-cpp-python, vocab only).

The vocabulary is llama.cpp's ggml-vocab-nomic-bert-moe.gguf: XLM-RoBERTa's 250k SentencePiece
pieces with its precompiled charsmap (NFKC and whitespace folding), a space prefix and extra
whitespace removed. Every text of kiln's corpus and of llama.cpp's tokenizer suites, and edge cases
the charsmap, the unknown token and the special tokens meet, must give llama.cpp's ids; pieces and
decoding must give its bytes. Vocabularies written here from it cover what that file does not: user-
defined tokens (none there), the other whitespace settings, an int8 charsmap and none at all.
"""
from __future__ import annotations

import ctypes
import dataclasses
import os
import time
from pathlib import Path

import pytest

from compiler.core.errors import ModelFileError
from compiler.frontend.gguf_reader import read_vocab
from compiler.text.tokenizer import UNKNOWN, make_tokenizer
from means import skip_for_want_of
from tokenizer_corpus import corpus

NAMED = os.environ.get("KILN_VOCAB_SUITES")  # as test_tokenizer_suites.py finds llama.cpp's vocabularies
SUITES = Path(NAMED) if NAMED else Path(__file__).parent.parent / "build" / "vocab"
NOMIC = SUITES / "ggml-vocab-nomic-bert-moe.gguf"
SEPARATOR = "\n__ggml_vocab_test__\n"
FLAGS = [(True, True), (False, False), (True, False)]  # (add_special, parse_special)

if not NAMED and not NOMIC.is_file():
    skip_for_want_of(f"llama.cpp's vocabularies at {SUITES}", "`make vocab` unpacks them (or set KILN_VOCAB_SUITES "
                     "to the models/ directory of a llama.cpp checkout)", apt=False, allow_module_level=True)

EDGE = [
    "", " ", "   ", "\t", "\n", "\r\n", " \n\t ", "  leading", "trailing  ", "many    spaces   between",
    "tab\tand\nline",
    # what the charsmap rewrites: full-width, compatibility, ligatures, enclosed, combining, jamo, controls
    "ｈｅｌｌｏ", "ＨＥＬＬＯ\u3000ｗｏｒｌｄ", "①②③ ⑴ ⒜", "ﬁ ﬂ ﬃ office", "Ⅻ ½ ㎏ ㍻ ℌ ™", "e\u0301 n\u0303o A\u030a",
    "\u00e9\u0301", "\u1100\u1161\u11a8", "x\u00a0y\u2003z", "soft\u00adhyphen", "zero\u200bwidth\ufeff",
    "\x01\x02\x7f",
    "a\0b", "\0", "\ufffd", "\u2581", "\u2581\u2581x \u2581", "\ud800 lone surrogate",
    # scripts, emoji, and code points no piece covers (runs of unknowns)
    "日本語のテキスト", "中文，标点！", "한국어 문장", "Привет, мир", "مرحبا", "हिन्दी", "ภาษาไทย", "😀👍🏽👨\u200d👩\u200d👧 🇫🇷",
    "𓀀𓀁𓀂", "x𓀀𓀁y 𓀂", "ꦗꦮ ᚠᚢᚦ 𐌰𐌱𐌲", "𓀀 𓀁", "\U0010ffff",
    # special tokens, "<mask>" taking the space before it, and an unused token's text
    "<s>", "</s>", "<unk>", "<pad>", "<mask>", "a <mask> b", "a\t <mask>", "<mask> <mask>", "<s>hi</s>", "<unk>𓀀",
    "[PAD250001]", "x[PAD250001]y",
    # long words
    "a" * 5000, "supercalifragilistic" * 200, "日本" * 1000, "𓀀" * 500, " " * 3000 + "x",
]


def _texts() -> list[str]:
    """kiln's corpus, every input of llama.cpp's suites (split as test-tokenizer-0 does), the edge cases."""
    texts = list(corpus())
    for inp in sorted(SUITES.glob("ggml-vocab-*.gguf.inp")):
        texts += inp.read_bytes().decode("utf-8").split(SEPARATOR)
    return texts + EDGE


def _encode(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")


@pytest.fixture(scope="module")
def llama_cpp():
    try:
        import llama_cpp
    except ImportError:
        skip_for_want_of("llama-cpp-python", "`make dev` builds it", apt=False)
    return llama_cpp


@pytest.fixture(scope="module")
def kiln():
    return make_tokenizer(read_vocab(NOMIC), str(NOMIC))


@pytest.fixture(scope="module")
def ref(llama_cpp):
    return llama_cpp.Llama(model_path=str(NOMIC), vocab_only=True, verbose=False)


def _mismatches(tok, ref, texts):
    bad = []
    for text in texts:
        for add, special in FLAGS:
            ours = tok.tokenize(text, add, special)
            theirs = ref.tokenize(_encode(text), add_bos=add, special=special)
            if ours != theirs:
                bad.append((text[:40], add, special, ours[:12], theirs[:12]))
    return bad


def test_every_text_matches_llamacpp(kiln, ref):
    texts = _texts()
    assert len(texts) > 900
    bad = _mismatches(kiln, ref, texts)
    assert not bad, f"{len(bad)} of {len(texts) * len(FLAGS)} differ, first: {bad[:3]}"


@pytest.mark.parametrize("text", EDGE, ids=range(len(EDGE)))
def test_edge_case_matches_llamacpp(kiln, ref, text):
    assert not _mismatches(kiln, ref, [text])


def test_the_charsmap_rewrites(kiln):
    """The cases above pass through the normalizer's rules, not around them."""
    assert kiln.unigram.normalize("ｈｅｌｌｏ ①ﬁ\tⅫ  x ").decode() == "\u2581hello\u25811fi\u2581XII\u2581x"
    assert kiln.tokenize("ｈｅｌｌｏ", False, False) == kiln.tokenize("hello", False, False)
    assert kiln.tokenize("e\u0301", False, False) == kiln.tokenize("\u00e9", False, False)


def test_a_run_of_unknowns_is_one_token(kiln, ref):
    unk = kiln.data.unk_id
    ids = kiln.tokenize("x𓀀𓀁𓀂y", False, False)
    assert ids.count(unk) == 1 and ids == ref.tokenize(_encode("x𓀀𓀁𓀂y"), add_bos=False, special=False)
    assert kiln.tokenize("𓀀 𓀁", False, False).count(unk) == 2  # a space between: two runs


def test_bos_and_eos_as_the_gguf_asks(kiln):
    d = kiln.data
    assert d.add_bos and d.add_eos and (d.bos_id, d.eos_id) == (0, 2)
    assert kiln.tokenize("hi")[0] == 0 and kiln.tokenize("hi")[-1] == 2 and kiln.tokenize("") == [0, 2]
    assert kiln.tokenize("hi", add_special=False)[0] != 0


def _pieces(llama_cpp, ref, ids, special: bool) -> bytes:
    """llama-cpp-python's Llama.detokenize (token_to_piece per token), with room for a 48-byte piece
    (its own buffer is 32 bytes) and without its strip of a space after BOS, which kiln leaves (as
    for every SentencePiece vocabulary)."""
    buf = ctypes.create_string_buffer(256)
    out = []
    for t in ids:
        n = llama_cpp.llama_token_to_piece(ref._model.vocab, t, buf, len(buf), 0, special)
        assert 0 <= n <= len(buf)
        out.append(buf.raw[:n])
    return b"".join(out)


@pytest.mark.parametrize("special", [False, True])
def test_every_piece_as_llamacpps(kiln, ref, llama_cpp, special):
    """Each of the 250k tokens: normal, control, unknown and unused ones."""
    n = len(kiln.data.tokens)
    bad = [t for t in range(n) if kiln.token_bytes(t, special) != _pieces(llama_cpp, ref, [t], special)]
    assert not bad, f"{len(bad)} pieces differ, first: {[(t, kiln.data.tokens[t]) for t in bad[:5]]}"
    assert kiln.types[kiln.data.unk_id] == UNKNOWN


def test_detokenize_as_llamacpps(kiln, ref, llama_cpp):
    bad = []
    for text in _texts():
        for add, special in FLAGS:
            ids = kiln.tokenize(text, add, special)
            want = _pieces(llama_cpp, ref, ids, special).decode("utf-8", errors="replace")
            if kiln.detokenize(ids, special) != want:
                bad.append((text[:40], add, special))
    assert not bad, f"{len(bad)} differ, first: {bad[:3]}"
    # what decoding keeps: the normalized text, spaces for U+2581 (the leading one included)
    assert kiln.detokenize(kiln.tokenize("ｈｅｌｌｏ   ｗｏｒｌｄ", add_special=False)) == " hello world"


def test_loads_and_tokenizes_in_bounded_time(kiln):
    """Bounds on the wait, not timings: loading takes about half a second, 10 kB about 20 ms."""
    t0 = time.monotonic()
    make_tokenizer(read_vocab(NOMIC), str(NOMIC))
    assert time.monotonic() - t0 < 10
    text = "\n".join(_texts())[:200_000]
    t0 = time.monotonic()
    kiln.tokenize(text, False, False)
    assert time.monotonic() - t0 < 60


# -- vocabularies written from nomic-bert-moe's ----------------------------------------------------
# user-defined texts: non-ASCII ones that an input can share a partial code point with ("日曜" walks
# "日" and the first byte of "本"), one with a space, one of U+2581s, one the charsmap makes ("ｘｙｚ")
USER = ["<ud>", "ét§", "日本語です", "ab c", "e\u0301x", "\u2581\u2581", "[PAD250001]", "x\u00a0y", "xyz"]
USER_TEXTS = ["<ud>", " <ud> <ud>x", "ét§", "ét", "éz", "è", "caffè", "日本語です!", "日本語で", "日曜", "日", "ab c",
              "ab  c", "ab d", "e\u0301x", "e\u0301y", "\u2581\u2581\u2581", "[PAD250001]", "[PAD2500", "x\u00a0y",
              "x y", "ｘｙｚ", "\ufffd"]
VARIANTS = {
    "as-nomic": {},
    "spaces-kept": {"remove_extra_whitespaces": False},
    "no-prefix": {"remove_extra_whitespaces": False, "add_space_prefix": False},
    "no-prefix-spaces-merged": {"add_space_prefix": False},
    "int8-charsmap": {"charsmap": "int8"},
    "no-charsmap": {"charsmap": None},
    "t5-arch": {"arch": "t5"},  # "<mask>" keeps the space before it
}


def _write_vocab(path: Path, tokens, scores, types, arch="nomic-bert-moe", charsmap="uint8", **flags) -> Path:
    """A vocabulary-only GGUF: the pieces given, nomic-bert-moe's charsmap, BOS 0, EOS 2, UNK 3."""
    import gguf

    w = gguf.GGUFWriter(str(path), arch)
    w.add_tokenizer_model("t5")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    for key in ("add_space_prefix", "remove_extra_whitespaces"):
        w.add_bool(f"tokenizer.ggml.{key}", flags.get(key, True))
    for key, tid in (("bos", 0), ("eos", 2), ("unknown", 3), ("padding", 1)):
        w.add_uint32(f"tokenizer.ggml.{key}_token_id", tid)
    w.add_add_bos_token(True)
    w.add_add_eos_token(True)
    blob = read_vocab(NOMIC).precompiled_charsmap
    if charsmap == "uint8":
        w.add_precompiled_charsmap(blob)
    elif charsmap is not None:
        kind = {"int8": gguf.GGUFValueType.INT8, "int32": gguf.GGUFValueType.INT32}[charsmap]
        w.add_key_value("tokenizer.ggml.precompiled_charsmap", [b - 256 if b > 127 else b for b in blob],
                        gguf.GGUFValueType.ARRAY, kind)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _nomic_like(path: Path, n: int = 30_000, **kw) -> Path:
    """nomic-bert-moe's first n pieces, USER as user-defined tokens (their GGUF score far below every
    piece's: llama.cpp's search takes them at 0), U+FFFD as a piece, then "<mask>"."""
    src = read_vocab(NOMIC)
    user = [u for u in USER if u not in src.tokens[:n]]  # llama.cpp refuses a repeated text
    return _write_vocab(path, [*src.tokens[:n], *user, "\ufffd", "<mask>"],
                        [*src.scores[:n], *[-1000.0] * len(user), -5.0, 0.0],
                        [*src.token_types[:n], *[4] * len(user), 1, 3], **kw)


@pytest.mark.parametrize("variant", VARIANTS)
def test_written_vocabulary_matches_llamacpp(variant, tmp_path, llama_cpp):
    path = _nomic_like(tmp_path / f"{variant}.gguf", **VARIANTS[variant])
    tok = make_tokenizer(read_vocab(path), str(path))
    ref = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    texts = USER_TEXTS + EDGE + corpus()
    bad = _mismatches(tok, ref, texts)
    assert not bad, f"{variant}: {len(bad)} of {len(texts) * len(FLAGS)} differ, first: {bad[:3]}"
    ids = [t for text in USER_TEXTS for t in tok.tokenize(text)]
    assert _pieces(llama_cpp, ref, ids, True).decode("utf-8", "replace") == tok.detokenize(ids, special=True)


def test_a_partial_code_point_is_searched_as_bytes(tmp_path):
    """After "日" and the first byte of "本" (of a user-defined "日本語です"), llama.cpp writes U+FFFD
    for each byte left of "曜" and searches text that is no longer UTF-8, a lead byte's worth at a
    time: the stray byte with two bytes of the first U+FFFD is unknown, so is its last byte (one
    unknown token for the two), and only the second U+FFFD is the U+FFFD piece."""
    tok = make_tokenizer(read_vocab(_nomic_like(tmp_path / "v.gguf")))
    assert tok.unigram.normalize("日曜") == "\u2581日".encode() + b"\xe6" + "\ufffd".encode() * 2
    assert tok.tokenize("日曜", False, False)[-2:] == [tok.data.unk_id, tok.vocab["\ufffd"]]


# a vocabulary made for the search's fine points: the lowest normal score M is a float whose M - 10
# rounds in float (llama.cpp's unknown score) below M - 10 in double, and "aZ" scores exactly that
M = -15.00000286102295
UNKNOWN_SCORE = -25.000003814697266  # float(np.float32(M) - np.float32(10))
TINY = [  # text, type (1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused), score
    ("<s>", 3, 0.0), ("<pad>", 3, 0.0), ("</s>", 3, 0.0), ("<unk>", 2, 0.0), ("\u2581", 1, -2.0), ("a", 1, 0.0),
    ("q", 1, M),  # the lowest normal score
    ("aZ", 5, UNKNOWN_SCORE),  # unused: "a" then an unknown "Z" ties it, and the first champion stays
    ("b", 1, -1.0), ("bZ", 5, -1000.0),  # unused, and below "b" then an unknown
    ("zqx", 5, -1.0),  # an unused piece the search takes
    ("ꙮ", 5, -10000.0),  # a code point's own piece, however low, keeps the unknown token out
    ("\u2581x", 4, -1000.0),  # user-defined: 0 in the search, whatever the GGUF says
    ("x", 1, -3.0), ("<mask>", 3, 0.0),
]
TINY_WANT = {"aZ": ["aZ"], "bZ": ["b", "<unk>"], "ꙮ": ["ꙮ"], "zqx": ["zqx"], " x": ["\u2581x"], "ZZ": ["<unk>"]}


def test_the_search_as_llamacpps(tmp_path, llama_cpp):
    """Ties kept by the first champion, the unknown score computed in float from normal tokens alone,
    unused and user-defined tokens in the search: each changes an answer here."""
    texts, types, scores = zip(*TINY)
    path = _write_vocab(tmp_path / "tiny.gguf", list(texts), list(scores), list(types), charsmap=None,
                        add_space_prefix=False, remove_extra_whitespaces=False)
    tok = make_tokenizer(read_vocab(path), str(path))
    assert tok.unigram.unknown_score == UNKNOWN_SCORE != M - 10
    ref = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    got = {text: [tok.data.tokens[t] for t in tok.tokenize(text, False, False)] for text in TINY_WANT}
    assert got == TINY_WANT
    bad = _mismatches(tok, ref, list(TINY_WANT) + EDGE + corpus())
    assert not bad, f"{len(bad)} differ, first: {bad[:3]}"


def test_a_charsmap_not_of_bytes_is_refused(tmp_path):
    path = _nomic_like(tmp_path / "v.gguf", charsmap="int32")
    with pytest.raises(ModelFileError, match="precompiled_charsmap.*bytes"):
        read_vocab(path)


@pytest.mark.parametrize("blob", [b"\x01\x00", b"\x10\x00\x00\x00" + bytes(12), b"\x04\x00\x00\x00" + bytes(5)])
def test_a_corrupt_charsmap_is_refused(kiln, blob):
    """Too short for its header, an XCDA running past the end, an XCDA whose root leads nowhere."""
    data = dataclasses.replace(kiln.data, precompiled_charsmap=blob)
    with pytest.raises(ModelFileError, match="some.gguf.*precompiled_charsmap"):
        make_tokenizer(data, "some.gguf").tokenize("hello")
