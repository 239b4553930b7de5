"""The WordPiece vocabulary of a Hugging Face `tokenizer.json`, as llama.cpp's converter writes it.

llama.cpp's converter asks `transformers` for the vocabulary and `gguf.SpecialVocab` for the special
tokens; kiln reads the same facts from tokenizer.json and tokenizer_config.json itself, for the
BERT tokenizers `kiln convert` takes. `hf_encode` is Hugging Face's BERT tokenization (BertNormalizer,
BertPreTokenizer, WordPiece, the [CLS]/[SEP] template): llama.cpp names a vocabulary's pre-tokenizer
by the hash of what it makes of one text, and the tests hold llama.cpp's tokenizer to it.
"""
from __future__ import annotations

import hashlib
import json
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path

from gguf import TokenType

from ..core.errors import ModelFileError

# The text and the hashes of llama.cpp's get_vocab_base_pre, for WordPiece vocabularies. It tests
# them in order without stopping, so the second name for 0876d13b... is the one it writes.
CHKTXT = (
    "\n \n\n \n\n\n \t \t\t \t\n  \n   \n    \n     \n🚀 (normal) 😶\u200d🌫️ (multiple emojis concatenated) "
    "✅ 🦙🦙 3 33 333 3333 33333 333333 3333333 33333333 3.3 3..3 3...3 កាន់តែពិសេសអាច😁 ?我想在apple工作1314151天～ "
    "------======= нещо на Български ''''''```````\"\"\"\"......!!!!!!?????? I've been 'told he's there, 'RE you "
    "sure? 'M not sure I'll make it, 'D you like some tea? We'Ve a'lL")
PRE_BY_HASH = {
    "0876d13b50744004aa9aeae05e7b0647eac9d801b5ba4668afc01e709c15e19f": "jina-v2-en",  # after "bert-bge"
    "8e62295832751ca1e8f92f2226f403dea30dc5165e448b5bfa05af5340c64ec7": "bert-bge-large",
}
UNKNOWN_PRE = "default"  # llama.cpp's converter refuses such a vocabulary; its WordPiece never reads the name

# Rust's char::is_whitespace (the White_Space property), which the Hugging Face normalizer uses
_WHITESPACE = frozenset("\t\n\v\f\r \x85\xa0\u1680\u2028\u2029\u202f\u205f\u3000") | frozenset(
    chr(c) for c in range(0x2000, 0x200B))
_CJK = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F), (0x2B740, 0x2B81F),
        (0x2B920, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F))
_SPECIAL_TYPES = ("bos", "eos", "unk", "sep", "pad", "cls", "mask")
_WRITTEN_IDS = ("bos", "eos", "unk", "sep", "pad", "mask")  # gguf's writer has no cls key: SpecialVocab skips it


@dataclass
class BertVocab:
    tokens: list[str]  # U+2581 before a word start, "##" taken off a continuation
    types: list[int]
    pre: str
    special_ids: dict[str, int] = field(default_factory=dict)
    add_special: dict[str, bool] = field(default_factory=dict)
    lowercase: bool | None = None
    strip_accents: bool | None = None


def _load(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ModelFileError(f"{path}: cannot be read as JSON ({e})") from None


def _looks_special(t: str) -> bool:  # TextModel.does_token_look_special
    return (t in ("<pad>", "<mask>", "<2mass>", "[@BOS@]") or (t.startswith("<|") and t.endswith("|>"))
            or (t.startswith("<｜") and t.endswith("｜>")) or (t.startswith("<unused") and t.endswith(">")))


def read_vocab(folder: Path, vocab_size: int | None) -> BertVocab:
    path = folder / "tokenizer.json"
    if not path.is_file():
        raise ModelFileError(f"{path}: not found; kiln convert reads the vocabulary from tokenizer.json")
    tj = _load(path)
    model = tj.get("model") or {}
    if model.get("type") != "WordPiece" or not isinstance(model.get("vocab"), dict) or not model["vocab"]:
        raise ModelFileError(f"{path}: the tokenizer is {model.get('type')!r}, not WordPiece; kiln convert "
                             "takes BERT's WordPiece vocabulary only")
    if model.get("continuing_subword_prefix", "##") != "##":
        raise ModelFileError(f"{path}: continuation pieces start with {model['continuing_subword_prefix']!r}, "
                             "not '##' as llama.cpp's WordPiece assumes")
    added = {int(a["id"]): a for a in tj.get("added_tokens") or []}
    by_id = {int(i): t for t, i in model["vocab"].items()} | {i: a["content"] for i, a in added.items()}
    n = vocab_size if vocab_size is not None else len(by_id)
    if max(by_id) >= n:
        raise ModelFileError(f"{path}: token id {max(by_id)} is beyond the model's vocab_size {n} (config.json)")
    tokens, types = [], []
    for i in range(n):
        tok = by_id.get(i)
        if tok is None:
            tokens.append(f"[PAD{i}]")
            types.append(TokenType.UNUSED)
        elif i in added and (added[i].get("special") or _looks_special(tok)):
            tokens.append(tok)  # control tokens keep their spelling
            types.append(TokenType.CONTROL)
        else:
            user = i in added
            tok = tok.replace("\u2581", " ") if user else tok
            tokens.append(tok[2:] if tok.startswith("##") else "\u2581" + tok)
            types.append(TokenType.USER_DEFINED if user else TokenType.NORMAL)
    chkhsh = hashlib.sha256(str(hf_encode(tj, CHKTXT)).encode()).hexdigest()
    vocab = BertVocab(tokens, [int(t) for t in types], PRE_BY_HASH.get(chkhsh, UNKNOWN_PRE))
    _special_vocab(vocab, tj, folder, n)
    return vocab


def _special_vocab(vocab: BertVocab, tj: dict, folder: Path, n: int) -> None:
    """gguf.SpecialVocab's reading of a BERT tokenizer: the ids from tokenizer_config.json's token
    strings (then config.json's *_token_id), the add_* flags from the post-processor's template."""
    cfg_path = folder / "tokenizer_config.json"
    tc = _load(cfg_path) if cfg_path.is_file() else {}
    names = {t: tc.get(f"{t}_token") for t in _SPECIAL_TYPES}
    names = {t: (v.get("content") if isinstance(v, dict) else v) for t, v in names.items()}
    names["bos"] = names["bos"] or names["cls"]  # BERT's [CLS] stands for BOS, [SEP] for EOS
    names["eos"] = names["eos"] or names["sep"]
    norm = tj.get("normalizer") or {}
    for nm in (norm.get("normalizers") or [norm]) if norm.get("type") == "Sequence" else [norm]:
        kind = nm.get("type")
        if kind == "Lowercase":
            vocab.lowercase = True
        elif kind == "StripAccents":
            vocab.strip_accents = True
        elif kind == "BertNormalizer":
            vocab.lowercase = nm.get("lowercase", vocab.lowercase)
            vocab.strip_accents = nm.get("strip_accents", vocab.strip_accents)
    post = tj.get("post_processor") or {}
    for proc in post.get("processors", [post]):
        single = (proc.get("single") or []) if proc.get("type") == "TemplateProcessing" else []
        first = single[0].get("SpecialToken", {}).get("id") if len(single) > 1 else None
        last = single[-1].get("SpecialToken", {}).get("id") if len(single) > 1 else None
        if first:  # without a tokenizer_config.json, SpecialVocab takes the template's tokens as BOS/EOS
            vocab.add_special["bos"] = not tc or first in (names["bos"], names["cls"])
        if last:
            vocab.add_special["eos"] = not tc or last == names["eos"]
        if first or last:
            vocab.add_special["sep"] = False  # SpecialVocab's rule: a trailing [SEP] is EOS, not a separator
    for t in _SPECIAL_TYPES:
        if isinstance(tc.get(f"add_{t}_token"), bool):
            vocab.add_special.setdefault(t, tc[f"add_{t}_token"])
    cfg = _load(folder / "config.json")
    for t in _SPECIAL_TYPES:
        ids = [a.get("id") for a in tj.get("added_tokens") or [] if a.get("content") == names[t]]
        for tid in (ids[0] if ids else None, cfg.get(f"{t}_token_id")):
            if isinstance(tid, int) and 0 <= tid < n and t in _WRITTEN_IDS:
                vocab.special_ids.setdefault(t, tid)
    vocab.special_ids = {t: vocab.special_ids[t] for t in _WRITTEN_IDS if t in vocab.special_ids}
    vocab.add_special = {t: vocab.add_special[t] for t in _SPECIAL_TYPES if t in vocab.add_special}


def _is_control(c: str) -> bool:
    return c not in "\t\n\r" and unicodedata.category(c) in ("Cc", "Cf", "Cn", "Co", "Cs")


def _is_punct(c: str) -> bool:
    return (c.isascii() and not c.isalnum() and c.isprintable() and c != " ") or unicodedata.category(c)[0] == "P"


def hf_encode(tj: dict, text: str) -> list[int]:
    """Hugging Face's tokenization of text by a BERT tokenizer.json, [CLS] and [SEP] included."""
    norm, model = tj.get("normalizer") or {}, tj["model"]
    lowercase = norm.get("lowercase", True)
    strip = norm.get("strip_accents")
    chars = []
    for c in text:
        if c in ("\0", "\ufffd") or _is_control(c):
            continue
        if c in _WHITESPACE:
            chars.append(" ")
        elif norm.get("handle_chinese_chars", True) and any(a <= ord(c) <= b for a, b in _CJK):
            chars.append(f" {c} ")
        else:
            chars.append(c)
    s = "".join(chars)
    if lowercase if strip is None else strip:
        s = "".join(c for c in unicodedata.normalize("NFD", s) if unicodedata.category(c) != "Mn")
    if lowercase:
        s = "".join(c.lower() for c in s)  # one character at a time: no final-sigma rule
    words: list[str] = []
    for chunk in s.split():
        word = ""
        for c in chunk:
            if _is_punct(c):
                words += [word, c] if word else [c]
                word = ""
            else:
                word += c
        words += [word] if word else []
    vocab, unk = model["vocab"], model["vocab"][model.get("unk_token", "[UNK]")]
    ids = [vocab["[CLS]"]]
    for w in words:
        ids.extend(_wordpiece(w, vocab, unk, model.get("max_input_chars_per_word", 100)))
    return ids + [vocab["[SEP]"]]


def _wordpiece(word: str, vocab: dict[str, int], unk: int, max_chars: int) -> list[int]:
    if len(word) > max_chars:
        return [unk]
    out, start = [], 0
    while start < len(word):
        for end in range(len(word), start, -1):
            piece = word[start:end] if start == 0 else "##" + word[start:end]
            if piece in vocab:
                out.append(vocab[piece])
                start = end
                break
        else:
            return [unk]
    return out
