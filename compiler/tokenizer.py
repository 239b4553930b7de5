"""Tokenizers built from GGUF metadata, with llama.cpp's meaning of the flags.

`tokenize(text, add_special, parse_special)`:
- add_special prepends BOS (and appends EOS) only where the GGUF says the model wants them;
- parse_special turns the text of control tokens (`<|im_start|>`) into their ids; user-defined
  tokens are always matched, as llama.cpp does.

BPE ("gpt2" models): split out special tokens, pre-tokenize with the regexes llama.cpp uses
for the GGUF's `tokenizer.ggml.pre`, map bytes to GPT-2's printable characters, and merge
by rank. The `regex` package is used because Python's `re` has no \\p{L} / \\p{N}.
"""
from __future__ import annotations

from functools import lru_cache

import regex

from .errors import ModelFileError
from .gguf_model import TokenizerData

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_QWEN2 = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
          r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)")

# tokenizer.ggml.pre -> the regexes llama.cpp splits with, applied one after another
PRE_TOKENIZERS: dict[str, tuple[str, ...]] = {
    "gpt2": (_GPT2,),
    "default": (_GPT2,),
    "smollm": (r"\p{N}", _GPT2),
    "starcoder": (r"\p{N}", _GPT2),
    "refact": (r"\p{N}", _GPT2),
    "qwen2": (_QWEN2,),
}


@lru_cache(maxsize=1)
def gpt2_byte_chars() -> tuple[str, ...]:
    """GPT-2's reversible map from bytes to printable characters."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return tuple(table[b] for b in range(256))


def _split(pieces: list[str], pattern: regex.Pattern) -> list[str]:
    """Split every piece at the pattern's matches, keeping matches and the text between them."""
    out = []
    for piece in pieces:
        pos = 0
        for m in pattern.finditer(piece):
            if m.start() > pos:
                out.append(piece[pos:m.start()])
            if m.end() > m.start():
                out.append(m.group())
            pos = m.end()
        if pos < len(piece):
            out.append(piece[pos:])
    return out


class BPETokenizer:
    def __init__(self, data: TokenizerData, source: str = "model"):
        if data.merges is None:
            raise ModelFileError(f"{source}: a gpt2 (BPE) tokenizer needs tokenizer.ggml.merges")
        if data.pre not in PRE_TOKENIZERS:
            raise ModelFileError(
                f"{source}: unsupported pre-tokenizer '{data.pre}' (supported: {', '.join(sorted(PRE_TOKENIZERS))})"
            )
        self.data = data
        self.vocab = {t: i for i, t in enumerate(data.tokens)}
        self.ranks = {tuple(m.split(" ", 1)): r for r, m in enumerate(data.merges)}
        self.patterns = [regex.compile(p) for p in PRE_TOKENIZERS[data.pre]]
        self.specials = sorted(((t, i, ty) for i, (t, ty) in enumerate(zip(data.tokens, data.token_types))
                                if ty in (CONTROL, USER_DEFINED, UNKNOWN) and t),
                               key=lambda s: (-len(s[0]), s[1]))
        byte_chars = gpt2_byte_chars()
        self.byte_of = {c: b for b, c in enumerate(byte_chars)}
        self.byte_chars = byte_chars
        self._cache: dict[str, tuple[int, ...]] = {}

    # -- text -> ids --------------------------------------------------------------------------
    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        ids: list[int] = []
        if add_special and self.data.add_bos and self.data.bos_id is not None:
            ids.append(self.data.bos_id)
        for frag in self._partition(text, parse_special):
            if isinstance(frag, int):
                ids.append(frag)
            else:
                for word in self._pretokenize(frag):
                    ids.extend(self._bpe(word))
        if add_special and self.data.add_eos and self.data.eos_id is not None:
            ids.append(self.data.eos_id)
        return ids

    def _partition(self, text: str, parse_special: bool) -> list[str | int]:
        """Cut special-token text out of the input, longest tokens first, as llama.cpp does."""
        frags: list[str | int] = [text]
        for tok, tid, ty in self.specials:
            if not parse_special and ty in (CONTROL, UNKNOWN):
                continue
            nxt: list[str | int] = []
            for f in frags:
                if isinstance(f, int) or tok not in f:
                    nxt.append(f)
                    continue
                parts = f.split(tok)
                for j, part in enumerate(parts):
                    if part:
                        nxt.append(part)
                    if j < len(parts) - 1:
                        nxt.append(tid)
            frags = nxt
        return frags

    def _pretokenize(self, text: str) -> list[str]:
        pieces = [text]
        for p in self.patterns:
            pieces = _split(pieces, p)
        return pieces

    def _bpe(self, word: str) -> tuple[int, ...]:
        cached = self._cache.get(word)
        if cached is not None:
            return cached
        symbols = [self.byte_chars[b] for b in word.encode("utf-8")]
        while len(symbols) > 1:
            best, at = None, -1
            for i in range(len(symbols) - 1):
                r = self.ranks.get((symbols[i], symbols[i + 1]))
                if r is not None and (best is None or r < best):
                    best, at = r, i
            if best is None:
                break
            symbols[at:at + 2] = [symbols[at] + symbols[at + 1]]
        ids: list[int] = []
        for s in symbols:
            tid = self.vocab.get(s)
            if tid is not None:
                ids.append(tid)
            else:  # not in the vocabulary: one token per byte, as llama.cpp falls back
                ids.extend(self.vocab[c] for c in s if c in self.vocab)
        result = tuple(ids)
        if len(self._cache) < 100_000:
            self._cache[word] = result
        return result

    # -- ids -> text --------------------------------------------------------------------------
    def token_bytes(self, tid: int, special: bool = False) -> bytes:
        text, ty = self.data.tokens[tid], self.data.token_types[tid]
        if ty in (CONTROL, UNKNOWN):
            return text.encode() if special else b""
        if ty == USER_DEFINED:
            return text.encode()
        return bytes(self.byte_of[c] for c in text if c in self.byte_of)

    def detokenize(self, ids, special: bool = False) -> str:
        return b"".join(self.token_bytes(int(t), special) for t in ids).decode("utf-8", errors="replace")


def make_tokenizer(data: TokenizerData, source: str = "model") -> BPETokenizer:
    if data.model == "gpt2":
        return BPETokenizer(data, source)
    raise ModelFileError(f"{source}: tokenizer model '{data.model}' is not supported yet (supported: gpt2)")
