"""Tokenizers built from GGUF metadata, with llama.cpp's meaning of the flags.

`tokenize(text, add_special, parse_special)`:
- add_special prepends BOS (and appends EOS) only where the GGUF says the model wants them;
- parse_special turns the text of control tokens (`<|im_start|>`) into their ids; user-defined
  tokens are always matched, as llama.cpp does.

Both models first cut special-token text out of the input (`Tokenizer`), then encode each
remaining fragment:
- BPE ("gpt2"): pre-tokenize with the regexes llama.cpp uses for the GGUF's
  `tokenizer.ggml.pre`, map bytes to GPT-2's printable characters, merge by rank. The `regex`
  package is used because Python's `re` has no \\p{L} / \\p{N}.
- SentencePiece ("llama"): spaces become U+2581, adjacent pieces merge highest score first
  while the merged text is in the vocabulary, and what no token covers falls back to <0xXX>
  byte tokens.
"""
from __future__ import annotations

import heapq

from functools import lru_cache

import regex

from ..core.errors import ModelFileError
from ..frontend.spec import TokenizerData

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


# End-of-generation spellings that llama.cpp treats as control tokens whatever type the GGUF
# gives them (it warns "control-looking token ... will be overridden"): Gemma's user-defined
# "</s>" is one, so with parse_special off llama.cpp tokenizes it as plain text.
CONTROL_LOOKING = frozenset({
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>", "<end_of_turn>",
    "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>",
    "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
})


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


class Tokenizer:
    """What both models share: special tokens, BOS/EOS rules, and the bytes of each token."""

    def __init__(self, data: TokenizerData, source: str = "model"):
        self.data = data
        self.vocab = {t: i for i, t in enumerate(data.tokens)}
        self.types = [CONTROL if t in CONTROL_LOOKING else ty for t, ty in zip(data.tokens, data.token_types)]
        self.specials = sorted(((t, i, ty) for i, (t, ty) in enumerate(zip(data.tokens, self.types))
                                if ty in (CONTROL, USER_DEFINED, UNKNOWN) and t),
                               key=lambda s: (-len(s[0]), s[1]))

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True,
                 plain: list[tuple[int, int]] = ()) -> list[int]:
        """llama.cpp's llama_tokenize. `plain`: spans of text where control-token look-alikes stay
        text even with parse_special (a chat prompt's messages: a user's "<|im_start|>system" is
        not the template's); the text is tokenized as one, so a span changes nothing else."""
        ids: list[int] = []
        if add_special and self.data.add_bos and self.data.bos_id is not None:
            ids.append(self.data.bos_id)
        prev_special = True
        for frag in self._partition(text, parse_special, plain):
            if isinstance(frag, int):
                ids.append(frag)
                prev_special = True
            else:
                ids.extend(self._encode(frag, prev_special))
                prev_special = False
        if add_special and self.data.add_eos and self.data.eos_id is not None:
            ids.append(self.data.eos_id)
        return ids

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
                    if j > prev:
                        nxt.append(f[prev:j])
                        nxt_starts.append(at + prev)
                    nxt.append(tid)
                    nxt_starts.append(at + j)
                    prev = j + len(tok)
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
            raise ModelFileError(f"{source}: a gpt2 (BPE) tokenizer needs tokenizer.ggml.merges")
        if data.pre not in PRE_TOKENIZERS:
            raise ModelFileError(
                f"{source}: unsupported pre-tokenizer '{data.pre}' (supported: {', '.join(sorted(PRE_TOKENIZERS))})"
            )
        super().__init__(data, source)
        self.ranks = {tuple(m.split(" ", 1)): r for r, m in enumerate(data.merges)}
        self.patterns = [regex.compile(p) for p in PRE_TOKENIZERS[data.pre]]
        byte_chars = gpt2_byte_chars()
        self.byte_of = {c: b for b, c in enumerate(byte_chars)}
        self.byte_chars = byte_chars
        self._cache: dict[str, tuple[int, ...]] = {}

    def _encode(self, text: str, after_special: bool) -> list[int]:
        return [t for word in self._pretokenize(text) for t in self._bpe(word)]

    def _pretokenize(self, text: str) -> list[str]:
        pieces = [text]
        for p in self.patterns:
            pieces = _split(pieces, p)
        return pieces

    def _bpe(self, word: str) -> tuple[int, ...]:
        cached = self._cache.get(word)
        if cached is not None:
            return cached
        symbols = merge_pairs([self.byte_chars[b] for b in word.encode("utf-8")],
                              lambda a, b: self.ranks.get((a, b)))
        ids: list[int] = []
        for s in symbols:
            tid = self.vocab.get(s)
            if tid is not None:
                ids.append(tid)
            else:  # not in the vocabulary: one token per byte, as llama.cpp falls back
                ids.extend(self.vocab[c] for c in s if c in self.vocab)
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
        return bytes(self.byte_of[c] for c in text if c in self.byte_of)


class SPMTokenizer(Tokenizer):
    SPACE = "\u2581"

    def __init__(self, data: TokenizerData, source: str = "model"):
        if data.scores is None:
            raise ModelFileError(f"{source}: a SentencePiece tokenizer needs tokenizer.ggml.scores")
        super().__init__(data, source)
        self.scores = data.scores
        self.byte_token = {}
        for i, (t, ty) in enumerate(zip(data.tokens, data.token_types)):
            if ty == BYTE and len(t) == 6 and t.startswith("<0x"):
                self.byte_token[int(t[3:5], 16)] = i

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


TOKENIZER_MODELS = {"gpt2": BPETokenizer, "llama": SPMTokenizer}


def make_tokenizer(data: TokenizerData, source: str = "model") -> Tokenizer:
    model = TOKENIZER_MODELS.get(data.model)
    if model is None:
        raise ModelFileError(f"{source}: tokenizer model '{data.model}' is not supported "
                             f"(supported: {', '.join(TOKENIZER_MODELS)})")
    return model(data, source)
