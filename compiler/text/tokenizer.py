"""Tokenizers built from GGUF metadata, with llama.cpp's meaning of the flags.

`tokenize(text, add_special, parse_special)`:
- add_special prepends BOS (and appends EOS / SEP) only where the GGUF, or llama.cpp's default
  for its tokenizer (frontend/vocab.py), says the model wants them;
- parse_special turns the text of control tokens (`<|im_start|>`) into their ids; user-defined
  tokens are always matched, as llama.cpp does (specials.py: which tokens are which).

Every model first cuts special-token text out of the input (`Tokenizer`), then encodes each
remaining fragment:
- BPE ("gpt2"): pre-tokenize with the regexes llama.cpp uses for the GGUF's
  `tokenizer.ggml.pre` (pretokenize.py), map bytes to GPT-2's printable characters, merge by
  rank. Gemma 4 ("gemma4") is BPE on SentencePiece-style text: spaces as U+2581, raw UTF-8,
  <0xXX> byte tokens.
- SentencePiece ("llama"): spaces become U+2581, adjacent pieces merge highest score first
  while the merged text is in the vocabulary, and what no token covers falls back to <0xXX>
  byte tokens.
- WordPiece ("bert"): wpm.py.
- Unigram ("t5"): ugm.py.
"""
from __future__ import annotations

import heapq
from functools import lru_cache

from ..core.errors import ModelFileError
from ..frontend.spec import TokenizerData
from .pretokenize import PRE_TOKENIZERS, compiled, split
from .specials import BYTE, CONTROL, NORMAL, UNKNOWN, UNUSED, USER_DEFINED, stripping, token_types
from .ugm import Unigram
from .wpm import WordPiece

__all__ = ["BYTE", "CONTROL", "NORMAL", "UNKNOWN", "UNUSED", "USER_DEFINED", "Tokenizer", "make_tokenizer",
           "merge_pairs", "gpt2_byte_chars"]


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


def merge_pairs(pieces: list[str], priority) -> list[str]:
    """Merge adjacent pieces, the best pair first (the lowest priority(left, right); None: never),
    leftmost on a tie, until no pair merges. A heap over a linked list: O(n log n) in the pieces,
    so a long word costs seconds, not hours, as the reference BPE implementations do it."""
    nxt = list(range(1, len(pieces))) + [-1]
    prv = list(range(-1, len(pieces) - 1))
    heap: list[tuple[float, int, str, str]] = []

    def push(left: int) -> None:
        right = nxt[left] if left >= 0 else -1
        if right >= 0:
            key = priority(pieces[left], pieces[right])
            if key is not None:
                heapq.heappush(heap, (key, left, pieces[left], pieces[right]))

    for i in range(len(pieces) - 1):
        key = priority(pieces[i], pieces[i + 1])
        if key is not None:
            heap.append((key, i, pieces[i], pieces[i + 1]))
    heapq.heapify(heap)
    while heap:
        _, left, a, b = heapq.heappop(heap)
        right = nxt[left]
        if right < 0 or pieces[left] != a or pieces[right] != b:
            continue  # stale: one side has merged since this pair was queued
        pieces[left], pieces[right] = a + b, ""
        nxt[left] = nxt[right]
        if nxt[right] >= 0:
            prv[nxt[right]] = left
        push(prv[left])
        push(left)
    out, i = [], 0 if pieces else -1
    while i >= 0:
        out.append(pieces[i])
        i = nxt[i]
    return out


_ASCII_SPACE = " \t\n\v\f\r"  # what llama.cpp strips beside an lstrip/rstrip special token (C isspace)


class Tokenizer:
    """What every model shares: special tokens, BOS/EOS rules, and the bytes of each token."""

    def __init__(self, data: TokenizerData, source: str = "model"):
        self.data = data
        self.vocab = {t: i for i, t in enumerate(data.tokens)}
        self.types = token_types(data)
        self.lstrip, self.rstrip = stripping(data, self.types)
        self.specials = sorted(((t, i, ty) for i, (t, ty) in enumerate(zip(data.tokens, self.types))
                                if ty in (CONTROL, USER_DEFINED, UNKNOWN) and t),
                               key=lambda s: (-len(s[0]), s[1]))

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True,
                 plain: list[tuple[int, int]] = ()) -> list[int]:
        """llama.cpp's llama_tokenize. `plain`: spans of text where control-token look-alikes stay
        text even with parse_special (a chat prompt's messages: a user's "<|im_start|>system" is
        not the template's); the text is tokenized as one, so a span changes nothing else."""
        ids: list[int] = self._first(add_special)
        prev_special = True
        for frag in self._partition(text, parse_special, plain) if text else []:
            if isinstance(frag, int):
                ids.append(frag)
                prev_special = True
            else:
                ids.extend(self._encode(frag, prev_special))
                prev_special = False
        return ids + self._last(add_special)

    def _first(self, add_special: bool) -> list[int]:
        d = self.data
        return [d.bos_id] if add_special and d.add_bos and d.bos_id is not None else []

    def _last(self, add_special: bool) -> list[int]:
        d = self.data
        return [d.eos_id] if add_special and d.add_eos and d.eos_id is not None else []

    def _encode(self, text: str, after_special: bool) -> list[int]:
        raise NotImplementedError

    def _partition(self, text: str, parse_special: bool, plain: list[tuple[int, int]] = ()) -> list[str | int]:
        """Cut special-token text out of the input, longest tokens first, as llama.cpp does; a
        control token is not cut where it overlaps a `plain` span."""
        frags: list[str | int] = [text]
        starts: list[int] = [0]  # each fragment's offset in text
        for tok, tid, ty in self.specials:
            control = ty in (CONTROL, UNKNOWN)
            if not parse_special and control:
                continue
            nxt, nxt_starts = [], []
            for f, at in zip(frags, starts):
                if isinstance(f, int) or tok not in f:
                    nxt.append(f)
                    nxt_starts.append(at)
                    continue
                cuts, i = [], 0
                while (j := f.find(tok, i)) >= 0:
                    if control and any(a < at + j + len(tok) and at + j < b for a, b in plain):
                        i = j + 1  # a look-alike in a plain span: not a cut
                        continue
                    cuts.append(j)
                    i = j + len(tok)
                prev = 0
                for j in cuts:
                    left = f[prev:j]
                    if tid in self.lstrip:
                        left = left.rstrip(_ASCII_SPACE)
                    if left:
                        nxt.append(left)
                        nxt_starts.append(at + prev)
                    nxt.append(tid)
                    nxt_starts.append(at + j)
                    prev = j + len(tok)
                    if tid in self.rstrip:
                        while prev < len(f) and f[prev] in _ASCII_SPACE:
                            prev += 1
                if prev < len(f):
                    nxt.append(f[prev:])
                    nxt_starts.append(at + prev)
            frags, starts = nxt, nxt_starts
        return frags

    def token_bytes(self, tid: int, special: bool = False) -> bytes:
        raise NotImplementedError

    def detokenize(self, ids, special: bool = False) -> str:
        return b"".join(self.token_bytes(int(t), special) for t in ids).decode("utf-8", errors="replace")


class BPETokenizer(Tokenizer):
    def __init__(self, data: TokenizerData, source: str = "model"):
        if data.merges is None:
            raise ModelFileError(f"{source}: a {data.model} (BPE) tokenizer needs tokenizer.ggml.merges")
        if data.pre_type not in PRE_TOKENIZERS:
            known = "not one llama.cpp knows" if data.pre_type is None else "not implemented by kiln"
            raise ModelFileError(f"{source}: unsupported pre-tokenizer '{data.pre}' ({known}); kiln supports "
                                 f"the {', '.join(sorted(PRE_TOKENIZERS))} families (frontend/vocab.py names them)")
        super().__init__(data, source)
        self.ranks: dict[tuple[str, str], int] = {}
        for r, m in enumerate(data.merges):
            cut = m.find(" ", 1)
            self.ranks.setdefault((m[:cut], m[cut + 1:]) if cut > 0 else ("", ""), r)  # the first rank stays
        self.patterns = compiled(data.pre_type)
        self.byte_encode = data.pre_type != "gemma4"  # Gemma 4 merges raw UTF-8, not GPT-2's byte characters
        byte_chars = gpt2_byte_chars()
        self.byte_of = {c: b for b, c in enumerate(byte_chars)}
        self.byte_chars = byte_chars
        self._cache: dict[str, tuple[int, ...]] = {}

    def _encode(self, text: str, after_special: bool) -> list[int]:
        if self.data.escape_whitespaces:
            text = text.replace(" ", "\u2581")
        words = split(text, self.patterns)
        if self.byte_encode:
            words = ["".join(self.byte_chars[b] for b in w.encode("utf-8")) for w in words]
        return [t for word in words for t in self._bpe(word)]

    def _bpe(self, word: str) -> tuple[int, ...]:
        cached = self._cache.get(word)
        if cached is not None:
            return cached
        whole = self.vocab.get(word)
        if whole is not None and (self.data.ignore_merges or (not self.byte_encode and not word.strip("\n"))):
            return (whole,)  # a word that is a token (Gemma 4: a run of newlines) is not merged from pieces
        symbols = merge_pairs(list(word), lambda a, b: self.ranks.get((a, b)))
        ids: list[int] = []
        for s in symbols:
            tid = self.vocab.get(s)
            if tid is not None:
                ids.append(tid)
                continue
            for b in s.encode("utf-8"):  # not in the vocabulary: a token per byte where there is one
                tid = self.vocab.get(chr(b) if b < 0x80 else "") if self.byte_encode else self.vocab.get(f"<0x{b:02X}>")
                if tid is not None:
                    ids.append(tid)
        result = tuple(ids)
        if len(self._cache) < 100_000 and len(word) <= 256:
            self._cache[word] = result
        return result

    # -- ids -> text --------------------------------------------------------------------------
    def token_bytes(self, tid: int, special: bool = False) -> bytes:
        text, ty = self.data.tokens[tid], self.types[tid]
        if ty in (CONTROL, UNKNOWN):
            return text.encode() if special else b""
        if ty == USER_DEFINED:
            return text.encode()
        if not self.byte_encode:
            return bytes([int(text[3:5], 16)]) if ty == BYTE else text.replace("\u2581", " ").encode()
        return bytes(self.byte_of[c] for c in text if c in self.byte_of)


class SPMTokenizer(Tokenizer):
    SPACE = "\u2581"

    def __init__(self, data: TokenizerData, source: str = "model"):
        if data.scores is None:
            raise ModelFileError(f"{source}: a SentencePiece tokenizer needs tokenizer.ggml.scores")
        super().__init__(data, source)
        self.scores = data.scores
        self.byte_token = {}
        for b in range(256):  # <0xXX>, else the byte itself as a token (llama.cpp's byte_to_token)
            tid = self.vocab.get(f"<0x{b:02X}>", self.vocab.get(chr(b)) if b < 0x80 else None)
            if tid is not None:
                self.byte_token[b] = tid

    def _encode(self, text: str, after_special: bool) -> list[int]:
        if self.data.add_space_prefix and after_special:
            text = " " + text
        text = text.replace(" ", self.SPACE)
        def priority(a: str, b: str) -> float | None:  # the highest-scoring token first
            tid = self.vocab.get(a + b)
            return None if tid is None else -self.scores[tid]

        ids: list[int] = []
        for piece in merge_pairs(list(text), priority):  # one symbol per character to start
            tid = self.vocab.get(piece)
            if tid is not None:
                ids.append(tid)
            else:
                for byte in piece.encode("utf-8"):
                    ids.append(self.byte_token.get(byte, self.data.unk_id if self.data.unk_id is not None else 0))
        return ids

    def token_bytes(self, tid: int, special: bool = False) -> bytes:
        text, ty = self.data.tokens[tid], self.types[tid]
        if ty in (CONTROL, UNKNOWN):
            return text.encode() if special else b""
        if ty == BYTE:
            return bytes([int(text[3:5], 16)])
        return text.replace(self.SPACE, " ").encode()


class WPMTokenizer(Tokenizer):
    """BERT: [CLS] words [SEP] with add_special, whatever the add_bos key says (as llama.cpp)."""

    def __init__(self, data: TokenizerData, source: str = "model"):
        super().__init__(data, source)
        self.wordpiece = WordPiece(data, self.vocab)

    def _first(self, add_special: bool) -> list[int]:
        return [self.data.bos_id] if add_special and self.data.bos_id is not None else []

    def _last(self, add_special: bool) -> list[int]:
        return [self.data.sep_id] if add_special and self.data.sep_id is not None else []

    def _encode(self, text: str, after_special: bool) -> list[int]:
        return self.wordpiece.encode(text)

    def token_bytes(self, tid: int, special: bool = False) -> bytes:
        text, ty = self.data.tokens[tid], self.types[tid]
        if ty in (CONTROL, UNKNOWN):
            return text.encode() if special else b""
        return text.replace("\u2581", " ").encode()


class UGMTokenizer(Tokenizer):
    """SentencePiece unigram (T5, XLM-RoBERTa): BOS and EOS as the GGUF's add_bos/add_eos say (llama.cpp's
    default is EOS alone); normalization by the vocabulary's precompiled charsmap, where it has one."""

    def __init__(self, data: TokenizerData, source: str = "model"):
        super().__init__(data, source)
        self.unigram = Unigram(data, self.types, data.precompiled_charsmap, source)
        mask = self.vocab.get("<mask>")
        if data.lstrip_mask and mask is not None:
            self.lstrip = self.lstrip | {mask}

    def _encode(self, text: str, after_special: bool) -> list[int]:
        return self.unigram.encode(text)  # every fragment gets its own space prefix, as in llama.cpp

    def token_bytes(self, tid: int, special: bool = False) -> bytes:
        text, ty = self.data.tokens[tid], self.types[tid]
        if ty in (CONTROL, UNKNOWN):
            return text.encode() if special else b""
        if ty == USER_DEFINED:
            return text.encode()
        if ty == NORMAL:
            return text.replace("\u2581", " ").encode()
        if ty == BYTE:
            return bytes([int(text[3:5], 16)])
        return b""  # an unused token: llama.cpp writes nothing for it


TOKENIZER_MODELS = {"gpt2": BPETokenizer, "gemma4": BPETokenizer, "llama": SPMTokenizer, "bert": WPMTokenizer,
                    "t5": UGMTokenizer}


def make_tokenizer(data: TokenizerData, source: str = "model") -> Tokenizer:
    model = TOKENIZER_MODELS.get(data.model)
    if model is None:
        raise ModelFileError(f"{source}: tokenizer model '{data.model}' is not supported "
                             f"(supported: {', '.join(TOKENIZER_MODELS)})")
    return model(data, source)
