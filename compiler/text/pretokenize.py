"""BPE pre-tokenizers: the regexes that cut text into words before merging, per pre-tokenizer
type (TokenizerData.pre_type, resolved from `tokenizer.ggml.pre` by frontend/vocab.py).

Each type is a list of regexes applied one after another: every piece of text is cut at each
match, and both the matches and the text between them become pieces (llama.cpp's
unicode_regex_split). Letters, numbers, marks, punctuation and symbols are Unicode's general
categories (`regex`'s \\p{..}); whitespace is Unicode's White_Space set, which is llama.cpp's,
not `regex`'s \\s (that one also takes U+001C..U+001F).
"""
from __future__ import annotations

from functools import lru_cache

import regex

_WS_MEMBERS = r"\t\n\v\f\r \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"

# 's 't 're 've 'm 'll 'd in either case
_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_TAIL = r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"  # punctuation runs, newlines, spaces
_LLAMA3 = _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}" + _TAIL
_QWEN2 = _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}" + _TAIL
_QWEN35 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
           r"|\s*[\r\n]+|\s+(?!\S)|\s+")
# upper-then-lower words ("HTTPServer" -> "HTTP", "Server"), as GPT-4o and Tekken cut them
_UPPER = r"(?:(?=\p{L})[^a-z])"
_LOWER = r"(?:(?=\p{L})[^A-Z])"


def _cased_words(suffix: str) -> str:
    lead = r"[^\r\n\p{L}\p{N}]?"
    return f"{lead}{_UPPER}*{_LOWER}+{suffix}|{lead}{_UPPER}+{_LOWER}*{suffix}"


_GPT4O = (_cased_words(_CONTRACTIONS + "?") + r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*"
          r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_TEKKEN = _cased_words("") + r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"

# DeepSeek's own classes (its tokenizer.json): cased letters of the alphabets it lists, ASCII and
# full-width punctuation with the quotes and CJK marks, and the CJK/Hangul blocks.
_DS_LETTERS = (
    r"A-Za-z\u00B5\u00C0-\u00D6\u00D8-\u00F6\u00F8-\u01BA\u01BC-\u01BF\u01C4-\u0293\u0295-\u02AF\u0370-\u0373"
    r"\u0376\u0377\u037B-\u037D\u037F\u0386\u0388-\u038A\u038C\u038E-\u03A1\u03A3-\u03F5\u03F7-\u0481"
    r"\u048A-\u052F\u0531-\u0556\u10A0-\u10C5\u13A0-\u13F5\u13F8-\u13FD\u1C90-\u1CBA\u1CBD-\u1CBF\u1D00-\u1D2B"
    r"\u1D6B-\u1D77\u1D79-\u1D9A\u1E00-\u1F15\u1F18-\u1F1D\u1F20-\u1F45\u1F48-\u1F4D\u1F50-\u1F57\u1F59\u1F5B"
    r"\u1F5D\u1F5F-\u1F7D\u1F80-\u1FB4\u1FB6-\u1FBC\u1FBE\u1FC2-\u1FC4\u1FC6-\u1FCC\u1FD0-\u1FD3\u1FD6-\u1FDB"
    r"\u1FE0-\u1FEC\u1FF2-\u1FF4\u1FF6-\u1FFC\u2102\u2107\u210A-\u2113\u2115\u2119-\u211D\u2124\u2126\u2128"
    r"\u212A-\u212D\u212F-\u2134\u2139\u213C-\u213F\u2145-\u2149\u214E\u2183\u2184\u2C00-\u2C7B\u2C7E-\u2CE4"
    r"\u2CEB-\u2CEE\u2CF2\u2CF3\uA640-\uA66D\uA680-\uA69B\uA722-\uA76F\uA771-\uA787\uA78B-\uA78E\uAB70-\uABBF"
    r"\uFB00-\uFB06\uFB13-\uFB17\uFF21-\uFF3A\uFF41-\uFF5A\U00010400-\U0001044F\U000104B0-\U000104D3"
    r"\U000104D8-\U000104FB\U00010C80-\U00010CB2\U00010CC0-\U00010CF2\U000118A0-\U000118DF\U0001E900-\U0001E943")
_DS_PUNCT = r"!-/:-~\uFF01-\uFF0F\uFF1A-\uFF5E\u2018-\u201F\u3000-\u3002"
_DS_CJK = r"[\u4E00-\u9FA5\u0800-\u4E00\uAC00-\uD7FF]+"
_ASCII_PUNCT = r"!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~"

# pre-tokenizer type -> its regexes, in order
PRE_TOKENIZERS: dict[str, tuple[str, ...]] = {
    # llama.cpp's generic split for BPE vocabularies that name no pre-tokenizer
    "default": (r"[\p{P}$+<=>^~|]+", _GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"),
    "gpt2": (_GPT2,),
    "starcoder": (r"\p{N}", _GPT2),
    "falcon": (r"[\p{P}$+<=>^~|`]+", _GPT2, r"[0-9][0-9][0-9]"),
    "llama3": (_LLAMA3,),
    "qwen2": (_QWEN2,),
    "qwen35": (_QWEN35,),
    "deepseek-llm": (r"[\r\n]", rf"\s?[{_DS_LETTERS}]+", rf"\s?[{_DS_PUNCT}]+", r"\s+\Z", _DS_CJK, r"\p{N}+"),
    "deepseek-coder": (r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", _DS_CJK, r"\p{N}"),
    "deepseek3": (r"\p{N}{1,3}", r"[\u4E00-\u9FA5\u3040-\u309F\u30A0-\u30FF]+",
                  rf"[{_ASCII_PUNCT}][A-Za-z]+|[^\r\n\p{{L}}\p{{P}}\p{{S}}]?[\p{{L}}\p{{M}}]+"
                  r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"),
    "bloom": (r" ?[^(\s|.,!?…。，、।۔،)]+",),
    "viking": (r" ?[^(\s|.,!?…。，、।۔،)]+", r"\p{N}"),
    "gpt4o": (_GPT4O,),
    "tekken": (_TEKKEN,),
    "seed-coder": (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+",),
    "bailingmoe": (r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                   r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+",),
    "ufakzeka": (r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}" + _TAIL,),
    "minicpm5": (r"\p{N}{1,3}", _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}+" + _TAIL),
    "laguna": (r"[^\n]+|\n+", _QWEN2),
    # Gemma 4: no words, only runs of newlines apart from the rest (spaces are U+2581 by then)
    "gemma4": (r"[^\n]+|\n+",),
}


def _llama_whitespace(pattern: str) -> str:
    """Spell \\s and \\S as llama.cpp's whitespace set, inside and outside character classes."""
    out, i, in_class = [], 0, False
    while i < len(pattern):
        c = pattern[i]
        if c == "\\" and i + 1 < len(pattern):
            nxt = pattern[i + 1]
            if nxt == "s":
                out.append(_WS_MEMBERS if in_class else f"[{_WS_MEMBERS}]")
            elif nxt == "S" and not in_class:
                out.append(f"[^{_WS_MEMBERS}]")
            else:
                out.append(pattern[i:i + 2])
            i += 2
            continue
        if c == "[" and not in_class:
            in_class = True
        elif c == "]" and in_class:
            in_class = False
        out.append(c)
        i += 1
    return "".join(out)


# llama.cpp runs a regex without Unicode categories on the code points themselves, after turning
# every non-ASCII whitespace into U+000B: such a space then matches \s but no literal range (the
# ideographic space U+3000 is not in DeepSeek's [U+3000-U+3002] punctuation, nor in its CJK blocks).
_MASK = {ord(c): "\v" for c in "\x85\xa0\u1680\u2028\u2029\u202f\u205f\u3000"}
_MASK |= {c: "\v" for c in range(0x2000, 0x200B)}


@lru_cache(maxsize=None)
def compiled(pre_type: str) -> tuple[tuple[regex.Pattern, bool], ...]:
    """Each regex of the type, and whether it matches the masked text (it names no \\p{..} class)."""
    return tuple((regex.compile(_llama_whitespace(p)), "\\p{" not in p) for p in PRE_TOKENIZERS[pre_type])


def split(text: str, patterns) -> list[str]:
    """Cut the text with each pattern in turn; matches and the text between them are all pieces."""
    pieces = [text]
    for pattern, masked in patterns:
        out = []
        for piece in pieces:
            pos = 0
            for m in pattern.finditer(piece.translate(_MASK) if masked else piece):
                if m.start() > pos:
                    out.append(piece[pos:m.start()])
                if m.end() > m.start():
                    out.append(piece[m.start():m.end()])
                pos = m.end()
            if pos < len(piece):
                out.append(piece[pos:])
        pieces = out
    return pieces
