"""llguidance's view of a kiln tokenizer: what a grammar engine needs to know about the vocabulary.

llguidance matches grammars on bytes, so it needs each token's bytes, which tokens are special
(never text a grammar can produce), the end-of-sequence token, and a way to tokenize text (for the
bytes a grammar forces). All of it comes from kiln's own tokenizer (tokenizer.py), so whatever the
tokenizer model (BPE, SentencePiece, WordPiece), llguidance sees exactly the bytes kiln decodes:
- a normal, byte or user-defined token: `token_bytes(i)`;
- a control or unknown token (`<|im_end|>`, `<eos>`): its text, marked special, so that a grammar
  never emits it as text; the end-of-generation ones are allowed where the grammar may end.

One exception, llguidance's own: a token whose bytes begin with 0xFF (SentencePiece's `<0xFF>`)
reads to it as special, since 0xFF is its marker for special tokens. No UTF-8 text contains that
byte, so no grammar over text could emit the token anyway.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import llguidance

from ..core.errors import ModelFileError
from .specials import CONTROL, UNKNOWN
from .tokenizer import Tokenizer

SPECIAL_MARKER = 0xFF  # llguidance's first byte of a special token


class _KilnTokenizer:
    """The fields and the call llguidance.LLTokenizer reads from a Python tokenizer (the shape of
    its TokenizerWrapper): tokens as bytes, special ids, BOS/EOS, and text -> ids."""
    is_tokenizer_wrapper = True

    def __init__(self, tokenizer: Tokenizer, eos: int):
        self._tokenizer = tokenizer
        self.special_token_ids = [i for i, ty in enumerate(tokenizer.types) if ty in (CONTROL, UNKNOWN)]
        special = set(self.special_token_ids)
        self.tokens = [tokenizer.token_bytes(i, special=i in special) for i in range(len(tokenizer.types))]
        self.eos_token_id = eos
        self.bos_token_id = tokenizer.data.bos_id

    def __call__(self, text: str | bytes) -> list[int]:
        """Text as kiln tokenizes it (no BOS, special-token look-alikes as text): llguidance asks
        this for the bytes a grammar forces, and takes the ids as the canonical tokenization."""
        if isinstance(text, bytes):
            text = text.decode("utf-8", errors="replace")
        return self._tokenizer.tokenize(text, add_special=False, parse_special=False)


@dataclass(frozen=True)
class GrammarVocab:
    """A model's vocabulary as llguidance takes it, with what llguidance does not model: every
    end-of-generation id (llguidance knows one end token, `eos`; the others are allowed wherever
    it is)."""
    lltokenizer: llguidance.LLTokenizer
    n_vocab: int
    eos: int
    eog_ids: tuple[int, ...]
    special_ids: frozenset[int]
    tokenize: Callable[[str], list[int]]  # text to ids as llguidance tokenizes it (kiln's, no specials)


def grammar_vocab(tokenizer: Tokenizer, n_vocab: int, source: str = "model") -> GrammarVocab:
    """Build llguidance's tokenizer from kiln's (about 0.1 s for SmolLM2's 49k tokens, 1 s for Gemma 3's
    262k): build it once per model."""
    data = tokenizer.data
    eog = sorted(i for i in data.eog_ids if 0 <= i < n_vocab)
    eos = data.eos_id if data.eos_id is not None and 0 <= data.eos_id < n_vocab else (eog[0] if eog else None)
    if eos is None:
        raise ModelFileError(f"{source}: the model has no end-of-generation token, so a constrained "
                             "output could never end")
    eog = sorted(set(eog) | {eos})
    wrapped = _KilnTokenizer(tokenizer, eos)
    if len(wrapped.tokens) > n_vocab:
        raise ModelFileError(f"{source}: the tokenizer has {len(wrapped.tokens)} tokens, more than the "
                             f"model's {n_vocab} logits")
    wrapped.tokens += [b""] * (n_vocab - len(wrapped.tokens))  # logits past the vocabulary: tokens of no text
    return GrammarVocab(llguidance.LLTokenizer(wrapped), n_vocab, eos, tuple(eog),
                        frozenset(wrapped.special_token_ids), wrapped)
