"""Constrained decoding from Python: llguidance's view of kiln's tokenizers (both bundled models),
JSON schema / regex / GBNF / Lark held on SmolLM2, greedy determinism and batch invariance with
constrained rows, errors that name the schema path, logit_bias, and the lazy (triggered) guide."""
from __future__ import annotations

import json
import re

import jsonschema
import numpy as np
import pytest

import compiler
from compiler.core.errors import OptionError
from compiler.frontend.gguf_reader import read_model
from compiler.runtime import Constraint, ConstraintError
from compiler.runtime.constraints import Guidance
from compiler.runtime.generation import Decoding
from compiler.runtime.sampling import Sampler, SamplingParams
from compiler.text.grammar_vocab import grammar_vocab
from compiler.text.tokenizer import make_tokenizer

PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age", "tags", "home"],
          "properties": {"name": {"type": "string", "maxLength": 24},
                         "age": {"type": "integer", "minimum": 0, "maximum": 120},
                         "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "maxItems": 3},
                         "home": {"anyOf": [{"type": "null"}, {"type": "object", "required": ["city"],
                                                               "properties": {"city": {"type": "string"}}}]}}}
ASK = "<|im_start|>user\nDescribe a person as JSON.<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def smol(smollm2):
    return compiler.load(smollm2, ctx=512, n_seq=4)


def _tokenizer(path):
    spec = read_model(path)
    return make_tokenizer(spec.tokenizer), spec.hparams.n_vocab


@pytest.mark.parametrize("model", ["smollm2", "gemma3"])
def test_llguidance_sees_kilns_token_bytes(model, request):
    tok, n_vocab = _tokenizer(request.getfixturevalue(model))
    v = grammar_vocab(tok, n_vocab)
    lt = v.lltokenizer
    assert lt.vocab_size == n_vocab and v.eos in v.eog_ids and set(tok.data.eog_ids) <= set(v.eog_ids)
    marked = 0
    for i in range(n_vocab):
        mine = tok.token_bytes(i, special=i in v.special_ids)
        if mine[:1] == b"\xff":  # llguidance's special marker; no UTF-8 text holds the byte (SentencePiece's <0xFF>)
            marked += 1
            continue
        assert lt.decode_bytes([i]) == mine, i
        assert lt.is_special_token(i) == (i in v.special_ids), i
    assert marked <= 1
    text = 'Prices: {"tea": 3.5, "naïve café": [1, 2]}\n\tend  東京'
    assert lt.tokenize_str(text) == tok.tokenize(text, add_special=False, parse_special=False)


@pytest.mark.parametrize("model", ["smollm2", "gemma3"])
def test_constrained_tokens_read_back(model, request):
    """Any walk through a schema's masks (random tokens, not the model's) is text whose kiln
    tokenization the schema's matcher takes whole: the two agree on every token's bytes."""
    path = request.getfixturevalue(model)
    tok, n_vocab = _tokenizer(path)
    g = Guidance(lambda: tok, n_vocab, str(path))
    for seed in range(3):
        guide = g.guide(Constraint.json_schema(PERSON))
        rng, out = np.random.default_rng(seed), []
        for _ in range(40):
            allowed = np.flatnonzero(guide.mask())
            if guide.stopped:
                break
            t = int(rng.choice(allowed[~np.isin(allowed, guide.vocab.eog_ids)]))
            out.append(t)
            guide.advance(t, tok.token_bytes(t))
        text = tok.detokenize(out)
        again = tok.tokenize(text, add_special=False, parse_special=False)
        assert tok.detokenize(again) == text
        fresh = g.matcher(Constraint.json_schema(PERSON))
        assert fresh.consume_tokens(again), (text, fresh.get_error())


def test_generate_holds_each_kind_of_constraint(smol):
    def person(**kw) -> str:
        text = smol.generate(ASK, max_tokens=96, json_schema=PERSON, **kw)
        jsonschema.validate(json.loads(text), PERSON, cls=jsonschema.Draft202012Validator)
        return text

    person(temperature=0)
    for seed in range(3):  # sampled, the format still holds
        person(temperature=1.0, seed=seed)
    phone = smol.generate("Call me on", max_tokens=20, temperature=0.7, seed=1, regex=r"\+1 [0-9]{3}-[0-9]{4}")
    assert re.fullmatch(r"\+1 [0-9]{3}-[0-9]{4}", phone)
    gbnf = 'root ::= answer " because " [a-z ]+ "."\nanswer ::= "yes" | "no"'
    said = smol.generate("Is the sky blue?", max_tokens=30, temperature=0, grammar=gbnf)
    assert re.fullmatch(r"(yes|no) because [a-z ]+\.", said), said
    colour = smol.generate("My favourite colour is", max_tokens=8, temperature=0, lark='start: "red" | "teal"')
    assert colour in ("red", "teal")
    streamed = "".join(smol.generate(ASK, max_tokens=96, temperature=0, json_schema=PERSON, stream=True))
    assert streamed == person(temperature=0)


def test_constrained_rows_are_batch_invariant_and_deterministic(smol, monkeypatch):
    """A constrained row's logits, before its mask, are the bits it gets alone; greedy output is the same."""
    seen: dict[Decoding, list[np.ndarray]] = {}  # each generation's rows, in order (keys keep them alive)
    plain_next = Decoding.next

    def spy(self, logits, n_past):
        seen.setdefault(self, []).append(logits.copy())
        return plain_next(self, logits, n_past)

    monkeypatch.setattr(Decoding, "next", spy)
    regex = r"[A-Z][a-z]+ (is|was) [a-z ]{3,30}\."
    alone = []
    for prompt, kw in ((ASK, {"json_schema": PERSON}), ("The moon", {"regex": regex})):
        with smol.sequence() as s:
            alone.append(s.generate(prompt, max_tokens=48, temperature=0, **kw))
    rows_alone = list(seen.values())
    seen.clear()
    together = smol.generate_batch([ASK, "Once upon a time", "The moon"], max_tokens=48, temperature=0,
                                   constraints=[{"json_schema": PERSON}, None, Constraint("regex", regex)])
    rows_together = list(seen.values())
    assert together[0] == alone[0] and together[2] == alone[1]
    for a, b in zip(rows_alone, [rows_together[0], rows_together[2]]):
        n = min(len(a), len(b))
        assert all(np.array_equal(x, y) for x, y in zip(a[:n], b[:n]))
    assert smol.generate_batch([ASK], max_tokens=48, temperature=0, json_schema=PERSON) == [alone[0]]


def test_bad_constraints_are_refused_by_name(smol):
    bad = {"type": "object", "properties": {"a": {"type": "array", "items": {"type": "strnig"}}}}
    with pytest.raises(ConstraintError, match=r"json_schema at /properties/a/items: .*strnig"):
        smol.generate(ASK, json_schema=bad)
    with pytest.raises(ConstraintError, match="json_schema at /properties/b: .*does not exist"):
        smol.generate(ASK, json_schema={"properties": {"b": {"$ref": "#/$defs/missing"}}})
    with pytest.raises(ConstraintError, match="json_schema: not valid JSON"):
        smol.generate(ASK, json_schema="{nope")
    with pytest.raises(ConstraintError, match="(?s)regex: .*unclosed group"):
        smol.generate(ASK, regex="[0-9]+(")
    with pytest.raises(ConstraintError, match="grammar: .*'missing' not found"):
        smol.generate(ASK, grammar="root ::= missing")
    with pytest.raises(OptionError, match="at most one of"):
        smol.generate(ASK, regex="a", lark='start: "a"')
    with pytest.raises(ConstraintError, match="at most"):
        smol.generate(ASK, regex="a" * (200 << 10))
    assert smol.generate("2 + 2 =", max_tokens=4, temperature=0)  # the model is unharmed


def test_logit_bias_bans_and_forces(smol):
    free = smol.generate("Once upon a time", max_tokens=6, temperature=0)
    first = smol.tokenize(free, add_special=False)[0]
    banned = smol.generate("Once upon a time", max_tokens=6, temperature=0, logit_bias={str(first): -100})
    assert smol.tokenize(banned, add_special=False)[0] != first
    bob = smol.tokenize(" Bob", add_special=False)[0]
    assert smol.generate("Once upon a time", max_tokens=3, temperature=0, logit_bias={bob: 100}) == " Bob" * 3
    with pytest.raises(OptionError, match="logit_bias: token id 10000000"):
        smol.generate("Hi", logit_bias={10000000: 1})
    with pytest.raises(OptionError, match=r"logit_bias: the bias of token 5 must be a number in \[-100, 100\]"):
        smol.generate("Hi", logit_bias={5: 101})


def test_mask_survives_every_sampling_filter():
    logits = np.random.default_rng(0).standard_normal(300).astype(np.float32) * 4
    allowed = np.zeros(300, bool)
    allowed[[3, 77, 250]] = True
    for params in (SamplingParams(temperature=0), SamplingParams(temperature=1.5, top_k=5, seed=1),
                   SamplingParams(temperature=1.0, top_k=0, top_p=0.5, min_p=0.2, repeat_penalty=1.3,
                                  presence_penalty=2, frequency_penalty=-2, seed=2)):
        s = Sampler(params)
        assert all(allowed[s(logits, [3, 77, 250, 1], allowed)] for _ in range(50))


def test_lazy_guide_constrains_only_after_its_trigger(smol):
    c = Constraint("regex", r"\n?[0-9]{2}\n?</tool_call>", trigger="<tool_call>")
    guide = smol.guidance.guide(c)
    tok = smol.tokenizer
    for t in tok.tokenize("Let me check. <tool", add_special=False, parse_special=False):
        assert guide.mask() is None  # free text until the trigger
        guide.advance(t, tok.token_bytes(t))
    rest = tok.tokenize("_call>", add_special=False, parse_special=False)
    for t in rest:
        assert guide.mask() is None
        guide.advance(t, tok.token_bytes(t))
    allowed = guide.mask()
    assert allowed is not None
    ok = [t for t in np.flatnonzero(allowed)]
    assert ok and all(re.fullmatch(r"\n?[0-9]{0,2}", tok.token_bytes(int(t)).decode("utf-8", "replace"))
                      or tok.token_bytes(int(t)).startswith(b"\n") for t in ok)
