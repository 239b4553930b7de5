"""BERT's WordPiece, as llama.cpp runs it (`tokenizer.ggml.model` "bert").

The text is normalized and cut into words: accents are stripped by keeping the first code point
of each character's canonical decomposition (so a Hangul syllable keeps only its first jamo),
letters are lower-cased, control characters dropped; whitespace ends a word, and punctuation,
ASCII symbols and CJK ideographs are words of their own. Each word, with U+2581 in front (the
GGUF's spelling of a word start), is then covered greedily by the longest tokens from the left;
a word that cannot be covered entirely becomes the unknown token.
"""
from __future__ import annotations

import unicodedata
from functools import lru_cache

from ..frontend.spec import TokenizerData

WHITESPACE = frozenset("\t\n\v\f\r \x85\xa0\u1680\u2028\u2029\u202f\u205f\u3000") | frozenset(
    chr(c) for c in range(0x2000, 0x200B))
_CJK = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F), (0x2B740, 0x2B81F),
        (0x2B920, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F))  # BERT's ranges (HF's, 0x2B920 included)


@lru_cache(maxsize=65536)
def _first_of_nfd(c: str) -> str:
    return unicodedata.normalize("NFD", c)[0]


def _lower(c: str) -> str:
    low = c.lower()
    return low if len(low) == 1 else low[0]  # simple case mapping: U+0130 -> "i"


def words(text: str, lowercase: bool = True, strip_accents: bool = True) -> list[str]:
    out: list[str] = []
    word: list[str] = []

    def finish() -> None:
        if word:
            out.append("".join(word))
            word.clear()

    for c in text:
        if strip_accents:
            c = _first_of_nfd(c)
        if c in WHITESPACE:
            finish()
            continue
        cat = unicodedata.category(c)
        if c in ("\0", "\ufffd") or cat in ("Cc", "Cf", "Co", "Cs"):
            continue
        if strip_accents and cat[0] == "M":
            continue
        cp = ord(c)
        if lowercase:
            c = _lower(c)
        if cat[0] == "P" or (cp < 0x7F and cat[0] == "S") or any(a <= cp <= b for a, b in _CJK):
            finish()
            out.append(c)
        else:
            word.append(c)
    finish()
    return out


class WordPiece:
    def __init__(self, data: TokenizerData, vocab: dict[str, int]):
        self.data, self.vocab = data, vocab
        self.max_len = max(len(t) for t in data.tokens)
        self.unk = data.unk_id if data.unk_id is not None else 0

    def encode(self, text: str) -> list[int]:
        ids: list[int] = []
        for w in words(text, self.data.lowercase, self.data.strip_accents):
            ids.extend(self._word("\u2581" + w))
        return ids

    def _word(self, w: str) -> list[int]:
        ids, i, n = [], 0, len(w)
        while i < n:
            for j in range(min(n, i + self.max_len), i, -1):
                tid = self.vocab.get(w[i:j])
                if tid is not None:
                    ids.append(tid)
                    i = j
                    break
            else:
                return [self.unk]  # a piece no token covers: the whole word is unknown
        return ids or [self.unk]
