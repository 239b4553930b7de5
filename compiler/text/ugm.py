"""SentencePiece's Unigram model, as llama.cpp runs it (`tokenizer.ggml.model` "t5": T5, XLM-RoBERTa).

Each text fragment is first normalized, on its UTF-8 bytes, as llama.cpp's
llm_tokenizer_ugm_session::normalize does:
- at each code point, a prefix of a user-defined token's text is kept as it is; else the longest
  prefix the precompiled charsmap (SentencePiece's normalization rules, NFKC and whitespace
  folding for XLM-R) knows is replaced by its replacement string; else the code point is kept;
- spaces then become U+2581, runs of spaces fold into one in front of each word where the GGUF asks
  to remove extra whitespace, and one is put before the first word where it asks for a space prefix.
The normalized text is then cut into tokens by Viterbi search: the cut whose token scores sum
highest, a code point no token covers counting as the unknown token at the lowest normal score
minus 10, and a run of unknown tokens given as one.
"""
from __future__ import annotations

import sys
from array import array

import numpy as np

from ..core.errors import ModelFileError
from ..frontend.spec import TokenizerData
from .specials import NORMAL, UNUSED, USER_DEFINED

SPACE = "\u2581"
UNKNOWN_PENALTY = np.float32(10.0)  # llama.cpp's unknown_token_score_penalty, a float
_CPT_LEN = bytes((1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4)[b >> 4] for b in range(256))  # unicode_len_utf8
_PREFIX = 3  # pieces are indexed by their first three characters (or bytes): see _longest
REPLACEMENT = "\ufffd".encode()


class CharsMap:
    """A precompiled charsmap: a little-endian uint32 byte count, then that many bytes of XOR-compressed
    compact double array (XCDA, a trie over UTF-8 bytes), then the NUL-terminated replacement strings
    the trie's leaves point at. Each XCDA entry packs BASE in bits 10-30 (shifted left 8 more when
    bit 9 is set), LEAF in bit 8, LCHECK (the byte that leads to the node) in bits 0-7; a value entry
    (a leaf's replacement offset) has bit 31 set, so that no byte matches it as LCHECK."""

    def __init__(self, blob: bytes, source: str = "model"):
        self.source = source
        self.units: array = array("I")
        self.replacements = b""
        self.root, self.starts = 0, frozenset()
        if not blob:
            return  # no normalization rules: every code point stays as it is
        if len(blob) < 4:
            self._corrupt("too small for its xcda_blob_size header")
        size = int.from_bytes(blob[:4], "little")
        if size + 4 >= len(blob):
            self._corrupt("its XCDA runs past its end")
        self.units.frombytes(blob[4:4 + size - size % 4])
        if sys.byteorder == "big":
            self.units.byteswap()
        self.replacements = blob[4 + size:]
        if not self.units:
            return  # llama.cpp skips an empty XCDA
        self.root = self._base(0)
        # the bytes some rule starts with: a code point that starts with no other one is kept unread.
        # (Where the root's child for a byte lies outside the array, llama.cpp fails when it meets
        # that byte; this refuses the charsmap at once.)
        self.starts = frozenset(c for c in range(1, 256) if self._node(self.root ^ c) & 0x800000FF == c)

    def _corrupt(self, what: str):
        raise ModelFileError(f"{self.source}: tokenizer.ggml.precompiled_charsmap is corrupt: {what}")

    def _node(self, index: int) -> int:
        if index >= len(self.units):
            self._corrupt("an XCDA index points past the array")
        return self.units[index]

    def _base(self, index: int) -> int:
        node = self._node(index)
        return (node >> 10) << ((node & 0x200) >> 6)

    def longest(self, data: bytes, start: int) -> tuple[int, bytes]:
        """(bytes matched, replacement) of the longest rule matching data[start:]; (0, b"") if none."""
        units, n = self.units, len(self.units)
        index, best, offset = self.root, 0, 0
        for pos in range(start, len(data)):
            c = data[pos]
            if c == 0:
                break  # the trie's keys are C strings
            index ^= c
            node = units[index] if index < n else self._node(index)
            if node & 0x800000FF != c:
                break
            index ^= (node >> 10) << ((node & 0x200) >> 6)
            if node & 0x100:  # a leaf: the node BASE leads to holds the replacement's offset
                best, offset = pos - start + 1, self._node(index) & 0x7FFFFFFF
        if not best:
            return 0, b""
        end = self.replacements.find(b"\0", offset)
        if offset >= len(self.replacements) or end < 0:
            self._corrupt("a replacement string runs past its end")
        return best, self.replacements[offset:end]


class Unigram:
    """The normalizer and the Viterbi search over one vocabulary."""

    def __init__(self, data: TokenizerData, types: list[int], charsmap: bytes = b"", source: str = "model",
                 treat_whitespace_as_suffix: bool = False):
        self.charsmap = CharsMap(charsmap, source)
        self.unk = data.unk_id if data.unk_id is not None else -1  # -1: llama.cpp's LLAMA_TOKEN_NULL
        scores = data.scores or (0.0,) * len(data.tokens)
        # text -> (id, score): normal, user-defined and unused tokens are in llama.cpp's token trie (the
        # last of a repeated text wins, as in its insert); user-defined ones score 0, above every normal one
        in_trie = (NORMAL, USER_DEFINED, UNUSED)
        self.pieces: dict[str, tuple[int, float]] = {
            text: (tid, 0.0 if ty == USER_DEFINED else scores[tid])
            for tid, (text, ty) in enumerate(zip(data.tokens, types)) if ty in in_trie and text}
        self.longest = _longest(self.pieces)
        self._byte_index: tuple[dict, dict] | None = None
        min_score = min((s for s, ty in zip(scores, types) if ty == NORMAL), default=np.inf)
        # computed in float as llama.cpp does (min_score - penalty), then summed in double; FLT_MAX where
        # there is no normal token
        floor = np.float32(min_score) if min_score != np.inf else np.finfo(np.float32).max
        self.unknown_score = float(floor - UNKNOWN_PENALTY)
        # llama.cpp matches user-defined text by walking a trie of it and keeps the whole path walked,
        # a token or only the beginning of one: every prefix of a user-defined text is such a path
        user_defined = [t.encode() for t, ty in zip(data.tokens, types) if ty == USER_DEFINED and t]
        self.user_paths = frozenset(t[:k] for t in user_defined for k in range(1, len(t) + 1))
        self.starts = self.charsmap.starts | {t[0] for t in user_defined}
        self.space = (SPACE if data.escape_whitespaces else " ").encode()
        self.prepend = data.add_space_prefix and not treat_whitespace_as_suffix
        self.append = data.add_space_prefix and treat_whitespace_as_suffix
        self.merge_spaces = data.remove_extra_whitespaces

    def encode(self, text: str) -> list[int]:
        normalized = self.normalize(text)
        try:
            return self.viterbi(normalized.decode("utf-8", "surrogatepass"))
        except UnicodeDecodeError:  # a user-defined text's prefix ended inside a code point: see rewrite
            return self.viterbi(normalized)

    # -- normalization ------------------------------------------------------------------------
    def rewrite(self, text: str) -> bytes:
        """The charsmap's replacements and the user-defined text, before whitespace is handled.

        A str's UTF-8 is valid (llama.cpp's decoder takes a surrogate's three bytes too), so a byte
        that starts no code point is met only where a prefix of a user-defined text ended inside one
        ("é" of a user-defined "ét" in "è"); llama.cpp writes U+FFFD for that byte, and what it then
        tokenizes is no longer UTF-8."""
        data = text.encode("utf-8", "surrogatepass")
        out: list[bytes] = []
        pos, kept, n = 0, 0, len(data)  # data[kept:pos] is unchanged text not yet in out
        starts, paths, charsmap = self.starts, self.user_paths, self.charsmap
        while pos < n:
            b = data[pos]
            if b in starts:
                k = 0
                while paths and pos + k < n and data[pos:pos + k + 1] in paths:
                    k += 1
                if k:
                    out += (data[kept:pos], data[pos:pos + k])  # a user-defined prefix is not normalized
                    pos = kept = pos + k
                    continue
                k, replacement = charsmap.longest(data, pos)
                if k:
                    out += (data[kept:pos], replacement)
                    pos = kept = pos + k
                    continue
            elif b & 0xC0 == 0x80:
                out += (data[kept:pos], REPLACEMENT)
                pos = kept = pos + 1
                continue
            pos += _CPT_LEN[b]
        out.append(data[kept:])
        return b"".join(out)

    def normalize(self, text: str) -> bytes:
        rewritten, space = self.rewrite(text), self.space
        if self.merge_spaces:  # one space before each run of non-spaces, none elsewhere
            out = b"".join(space + word for word in rewritten.split(b" ") if word)
        else:  # each space kept, and the prefix only where there is more than spaces
            out = rewritten.replace(b" ", space)
            if self.prepend and rewritten.strip(b" "):
                out = space + out
        return out + space if self.append else out

    # -- segmentation -------------------------------------------------------------------------
    def viterbi(self, text: str | bytes) -> list[int]:
        """llama.cpp's best_tokenization table: for each position, the best score of a cut ending there,
        its last token and where that token starts. Challengers come in the order llama.cpp tries
        them (start position, then length) and must beat the champion strictly, so ties resolve as
        there. A str steps by code points; bytes (text that is not UTF-8) by what each lead byte
        announces, as llama.cpp steps through any text."""
        n = len(text)
        if not n:
            return []
        if isinstance(text, bytes):
            pieces, longest = self._bytes_index()
        else:
            pieces, longest = self.pieces, self.longest
        unk, unknown_score, as_str = self.unk, self.unknown_score, isinstance(text, str)
        best = [-np.inf] * (n + 1)  # llama.cpp's -DBL_MAX: below every sum
        best[0] = 0.0
        last = [unk] * (n + 1)
        start = [0] * (n + 1)
        i = 0
        while i < n:
            here, step = best[i], 1 if as_str else min(_CPT_LEN[text[i]], n - i)
            single = False  # a token is this code point alone
            stop = min(n, i + _PREFIX)
            for j in range(i + 1, stop + 1):
                hit = pieces.get(text[i:j])
                if hit is not None:
                    score = here + hit[1]
                    if score > best[j]:
                        best[j], last[j], start[j] = score, hit[0], i
                    single = single or j == i + step
            if stop == i + _PREFIX and (far := longest.get(text[i:stop])):
                for j in range(stop + 1, min(n, i + far) + 1):
                    hit = pieces.get(text[i:j])
                    if hit is not None and (score := here + hit[1]) > best[j]:
                        best[j], last[j], start[j] = score, hit[0], i
                    single = single or (hit is not None and j == i + step)
            if not single:  # no token covers this code point alone: it may be the unknown token
                score = here + unknown_score
                if score > best[i + step]:
                    best[i + step], last[i + step], start[i + step] = score, unk, i
            i += step
        ids: list[int] = []
        pos, prev_unknown = n, False
        while pos > 0:  # back from the end; a run of unknown tokens is given as one
            tid = last[pos]
            if not (prev_unknown and tid == unk):
                ids.append(tid)
            prev_unknown = tid == unk
            pos = start[pos]
        ids.reverse()
        return ids

    def _bytes_index(self) -> tuple[dict, dict]:
        if self._byte_index is None:
            pieces = {text.encode("utf-8", "surrogatepass"): hit for text, hit in self.pieces.items()}
            self._byte_index = pieces, _longest(pieces)
        return self._byte_index


def _longest(pieces: dict) -> dict:
    """For each first-_PREFIX-units key of a longer piece, the longest piece's length: after _PREFIX units
    the search looks no further than that."""
    longest: dict = {}
    for text in pieces:
        if len(text) > _PREFIX and longest.get(text[:_PREFIX], 0) < len(text):
            longest[text[:_PREFIX]] = len(text)
    return longest
