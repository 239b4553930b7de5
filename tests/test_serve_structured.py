"""Structured output and tools in `kiln serve`, end to end: a real server process on SmolLM2 and the
real `openai` client. 20 pydantic models through `beta.chat.completions.parse`; json_object; GBNF
and regex; forced, automatic and refused tool calls, streamed and whole; tool results through the
chat template; 400s that name the field; and the constraint metrics. Every JSON answer is checked
against its schema by jsonschema (Draft 2020-12, formats included), never field by field."""
from __future__ import annotations

import concurrent.futures
import datetime
import enum
import json
import re
import uuid
from typing import Literal, Optional, Union

import httpx
import jsonschema
import pytest
from pydantic import BaseModel, Field, constr

from compiler.frontend.gguf_reader import read_model
from compiler.text.chat import render_chat_spans
from compiler.text.tokenizer import make_tokenizer
from server_process import KEY, MODEL, Server

FORMATS = jsonschema.Draft202012Validator.FORMAT_CHECKER  # date, uuid, ...; date-time only with rfc3339-validator


def conforms(text: str, schema: dict) -> object:
    """The answer as JSON, held to its schema (jsonschema.ValidationError names what breaks it)."""
    value = json.loads(text)
    jsonschema.validate(value, schema, cls=jsonschema.Draft202012Validator, format_checker=FORMATS)
    return value


# -- 20 shapes: nested objects, arrays, enums, bounded numbers, optional fields, anyOf, patterns, formats
class Color(str, enum.Enum):
    red = "red"
    green = "green"
    blue = "blue"


class Person(BaseModel):
    name: str
    age: int


class City(BaseModel):
    name: str
    country: str


class Address(BaseModel):
    street: str
    city: City


class Employee(BaseModel):
    person: Person
    address: Address


class Shopping(BaseModel):
    items: list[str]


class Scores(BaseModel):
    values: list[int] = Field(max_length=5)


class Paint(BaseModel):
    color: Color


class Rating(BaseModel):
    stars: int = Field(ge=1, le=5)
    comment: str


class Temperature(BaseModel):
    celsius: float = Field(ge=-50, le=60)


class Profile(BaseModel):
    username: str
    nickname: Optional[str] = None


class Cat(BaseModel):
    kind: Literal["cat"]
    lives: int


class Dog(BaseModel):
    kind: Literal["dog"]
    breed: str


class Pet(BaseModel):
    animal: Union[Cat, Dog]


class Code(BaseModel):
    sku: str = Field(pattern=r"^[A-Z]{3}-[0-9]{4}$")


class Meeting(BaseModel):
    title: str
    day: datetime.date


class Ticket(BaseModel):
    id: uuid.UUID
    opened: datetime.datetime


class Flag(BaseModel):
    enabled: bool
    note: Optional[str]


class Matrix(BaseModel):
    rows: list[list[int]]


class Team(BaseModel):
    members: list[Person]
    lead: Person


class Recipe(BaseModel):
    title: str
    servings: int = Field(ge=1, le=12)
    ingredients: list[str]
    vegetarian: bool


class Mood(BaseModel):
    mood: Literal["happy", "sad", "calm"]
    intensity: float = Field(ge=0, le=1)


class Tagged(BaseModel):
    label: constr(min_length=2, max_length=12)
    tags: list[Color]


SHAPES = [Person, Employee, Shopping, Scores, Paint, Rating, Temperature, Profile, Pet, Code, Meeting, Ticket, Flag,
          Matrix, Team, Recipe, Mood, Tagged, City, Address]
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["C", "F"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
ADD = {"type": "function", "function": {
    "name": "add", "description": "Add two integers",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                   "required": ["a", "b"], "additionalProperties": False}}}
ASK_WEATHER = [{"role": "user", "content": "What is the weather in Berlin?"}]


@pytest.fixture(scope="module")
def server(smollm2):
    s = Server("--ctx", "1024", "--n-seq", "8", "--page-size", "16", "--api-key", KEY)
    yield s
    s.stop()


def test_every_pydantic_shape_parses(server):
    """A tiny model writes poor content, but the format holds: every answer parses as its model and
    conforms to the model's JSON schema. (Sampling penalties keep its greedy answers from repeating
    until max_tokens.)"""
    client = server.client()

    def ask(shape):
        r = client.beta.chat.completions.parse(
            model=MODEL, response_format=shape, max_tokens=80, temperature=0, frequency_penalty=0.5,
            messages=[{"role": "system", "content": "You reply with short JSON."},
                      {"role": "user", "content": f"Give an example {shape.__name__} as JSON."}])
        return r.choices[0].message

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        messages = list(pool.map(ask, SHAPES))
    assert [type(m.parsed) for m in messages] == SHAPES
    for shape, m in zip(SHAPES, messages):
        conforms(m.content, shape.model_json_schema())


PLACE = {"type": "object", "additionalProperties": False, "required": ["name", "country", "population", "tags"],
         "properties": {"name": {"type": "string", "minLength": 1, "maxLength": 30},
                        "country": {"enum": ["France", "Germany", "Italy", "Spain"]},
                        "population": {"type": "integer", "minimum": 0, "maximum": 50_000_000},
                        "tags": {"type": "array", "items": {"type": "string", "pattern": "^[a-z]+$"}, "maxItems": 3},
                        "capital": {"type": "boolean"}}}
ANY_OBJECT = {"type": "object"}  # json_object: any JSON object, and nothing else
SHORT = {"role": "system", "content": "You reply with short JSON."}
# each format with a chat and a completion prompt that a tiny model answers in a whole value well within
# max_tokens (a JSON number's digits, say, may run on; a value cut at max_tokens is nothing to check)
FORMATS_ASKED = [
    ({"type": "json_schema", "json_schema": {"name": "place", "schema": PLACE, "strict": True}}, PLACE,
     [{"role": "user", "content": "Describe a city in France as JSON."}], "A city in France, as JSON:"),
    ({"type": "json_object"}, ANY_OBJECT, [SHORT, {"role": "user", "content": "Hello!"}],
     'A cat as a short JSON object: {"name": "Tom", "age": 3}\nA dog as a short JSON object:')]


def _answer(client, route: str, response_format: dict, messages: list, prompt: str, stream: bool) -> str:
    """The answer's text, streamed or whole, once it has ended by its grammar (not at max_tokens)."""
    common = {"model": MODEL, "max_tokens": 128, "temperature": 0, "frequency_penalty": 0.5, "stream": stream}
    if route == "chat":
        r = client.chat.completions.create(messages=messages, response_format=response_format, **common)
        pieces = [(c.choices[0].delta.content or "", c.choices[0].finish_reason) for c in r if c.choices] if stream \
            else [(r.choices[0].message.content, r.choices[0].finish_reason)]
    else:
        r = client.completions.create(prompt=prompt, extra_body={"response_format": response_format}, **common)
        pieces = [(c.choices[0].text, c.choices[0].finish_reason) for c in r if c.choices] if stream \
            else [(r.choices[0].text, r.choices[0].finish_reason)]
    text = "".join(t for t, _ in pieces)
    assert pieces[-1][1] == "stop", f"the answer ran to max_tokens: {text!r}"
    return text


@pytest.mark.parametrize("route", ["chat", "completions"])
@pytest.mark.parametrize("response_format, schema, messages, prompt", FORMATS_ASKED, ids=["json_schema", "json_object"])
def test_json_schema_and_json_object_hold_streamed_and_whole(server, route, response_format, schema, messages, prompt):
    """response_format on both routes, streamed (SSE) and whole: each answer conforms to its schema,
    and the stream is the whole answer, token for token."""
    client = server.client()
    whole, streamed = (_answer(client, route, response_format, messages, prompt, stream) for stream in (False, True))
    conforms(whole, schema)
    conforms(streamed, schema)
    assert streamed == whole


def test_json_object_and_llama_servers_json_schema(server):
    client = server.client()
    for question in ("Describe a cat.", "Hello!"):
        r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": question}],
                                           max_tokens=64, temperature=0, frequency_penalty=0.5,
                                           response_format={"type": "json_object"})
        conforms(r.choices[0].message.content, ANY_OBJECT)
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 1, "maximum": 9}},
              "required": ["n"], "additionalProperties": False}
    for stream in (False, True):
        r = client.completions.create(model=MODEL, prompt="A number:", max_tokens=16, temperature=0, stream=stream,
                                      extra_body={"json_schema": schema})  # llama-server's field
        conforms("".join(c.choices[0].text for c in r) if stream else r.choices[0].text, schema)


def test_gbnf_and_regex_hold(server):
    client = server.client()
    gbnf = 'root ::= answer ", " [a-z ]+ "."\nanswer ::= "Yes" | "No"'
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Is water wet?"}],
                                       max_tokens=24, temperature=0, extra_body={"grammar": gbnf})
    assert re.fullmatch(r"(Yes|No), [a-z ]+\.", r.choices[0].message.content), r.choices[0].message.content
    streamed = client.completions.create(model=MODEL, prompt="My phone number is", max_tokens=16, temperature=0.9,
                                         seed=5, stream=True, extra_body={"regex": r"\+44 [0-9]{4} [0-9]{6}"})
    assert re.fullmatch(r"\+44 [0-9]{4} [0-9]{6}", "".join(c.choices[0].text for c in streamed))


PARAMETERS = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, ADD)}


def _calls(message) -> list[tuple[str, dict]]:
    """The message's calls, each one's arguments held to its function's parameters' schema."""
    assert all(c.function.name in PARAMETERS for c in message.tool_calls), message.tool_calls
    return [(c.function.name, conforms(c.function.arguments, PARAMETERS[c.function.name]))
            for c in message.tool_calls]


def test_a_forced_call_is_valid_streamed_and_whole(server):
    client = server.client()
    for choice, name in (("required", None), ({"type": "function", "function": {"name": "add"}}, "add")):
        whole = client.chat.completions.create(model=MODEL, messages=ASK_WEATHER, tools=[WEATHER, ADD],
                                               tool_choice=choice, max_tokens=48, temperature=0)
        c = whole.choices[0]
        assert c.finish_reason == "tool_calls" and c.message.content is None and len(c.message.tool_calls) == 1
        call = c.message.tool_calls[0]
        assert call.type == "function" and call.id.startswith("call_")
        fn, _ = _calls(c.message)[0]
        assert fn == (name or fn)
        chunks = list(client.chat.completions.create(model=MODEL, messages=ASK_WEATHER, tools=[WEATHER, ADD],
                                                     tool_choice=choice, max_tokens=48, temperature=0, stream=True))
        deltas = [d for ch in chunks if ch.choices for d in ch.choices[0].delta.tool_calls or []]
        assert deltas[0].index == 0 and deltas[0].id and deltas[0].type == "function"
        assert deltas[0].function.name == fn and all(d.index == 0 for d in deltas)
        assert "".join(d.function.arguments or "" for d in deltas) == call.function.arguments
        assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "tool_calls"
    with client.beta.chat.completions.stream(model=MODEL, messages=ASK_WEATHER, tools=[WEATHER],
                                             tool_choice="required", max_tokens=48, temperature=0) as s:
        final = s.get_final_completion()  # the client's own accumulator reads our stream
    assert _calls(final.choices[0].message)[0][0] == "get_weather"


def test_auto_lets_the_model_choose_and_holds_a_call_to_its_schema(server):
    """A past call in the history (with the wrong name and argument) makes the model begin one; from
    `<tool_call>` on it is held to the tools' schemas. With "none" there are no calls."""
    client = server.client()
    wrong = '<tool_call>\n{"name": "weather", "arguments": {"town": "Paris"}}\n</tool_call>'
    history = [{"role": "user", "content": "Weather in Paris?"}, {"role": "assistant", "content": wrong},
               {"role": "user", "content": "Weather in Berlin?"}]
    r = client.chat.completions.create(model=MODEL, messages=history, tools=[WEATHER], max_tokens=48, temperature=0)
    assert r.choices[0].finish_reason == "tool_calls"
    (fn, _), = _calls(r.choices[0].message)
    assert fn == "get_weather"
    free = client.chat.completions.create(model=MODEL, messages=ASK_WEATHER, tools=[WEATHER], max_tokens=16,
                                          temperature=0)
    assert free.choices[0].message.tool_calls is None and free.choices[0].message.content
    none = client.chat.completions.create(model=MODEL, messages=history, tools=[WEATHER], tool_choice="none",
                                          max_tokens=16, temperature=0)
    assert none.choices[0].message.tool_calls is None and none.choices[0].finish_reason in ("stop", "length")


def test_tool_results_go_through_the_template(server, smollm2):
    messages = ASK_WEATHER + [
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
            "name": "get_weather", "arguments": '{"city": "Berlin", "unit": "C"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature": 18}'}]
    r = server.client().chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER], max_tokens=8,
                                                temperature=0)
    spec = read_model(smollm2)
    as_template = [{**m, "tool_calls": [{**c, "function": {**c["function"], "arguments": json.loads(
        c["function"]["arguments"])}} for c in m["tool_calls"]]} if m.get("tool_calls") else m for m in messages]
    text, plain = render_chat_spans(spec, as_template, tools=[WEATHER])
    assert '<tool_response>\n{"temperature": 18}\n</tool_response>' in text and '"city": "Berlin"' in text
    assert r.usage.prompt_tokens == len(make_tokenizer(spec.tokenizer).tokenize(text, plain=plain))


BAD = [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object", "properties": {"a": {"type": "strnig"}}}}}}, "response_format.json_schema.schema",
     "/properties/a"),
    ({"grammar": "root ::= missing"}, "grammar", "missing"),
    ({"regex": "[0-9"}, "regex", "regex"),
    ({"grammar": 'root ::= "a"', "json_schema": {"type": "object"}}, "json_schema", "only one of"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice", "nope"),
    ({"tool_choice": "required"}, "tool_choice", "needs tools"),
    ({"tools": [WEATHER], "grammar": 'root ::= "a"'}, "tools", "cannot also"),
    ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools.0.function.name", "pattern"),
    ({"logit_bias": {"99999999": 1}}, "logit_bias", "out of range"),
    ({"logit_bias": {"5": 300}}, "logit_bias", "-100, 100"),
    ({"grammar": "root ::= " + '"a" ' * 70_000}, "grammar", "at most"),
]


@pytest.mark.parametrize("extra, field, words", BAD)
def test_bad_constraints_are_400s_naming_the_field(server, extra, field, words):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, **extra}
    r = httpx.post(server.url + "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {KEY}"},
                   timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == field and words in err["message"], err


def test_a_dead_end_fails_alone_and_is_counted(server):
    """An endlessly recursive GBNF grammar runs into llguidance's limit on the parser's work after its
    first token: that request fails (a 400 naming its constraint), the one beside it does not."""
    client = server.client()
    before = server.metrics()
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        good = pool.submit(client.completions.create, model=MODEL, prompt="The capital of France is", max_tokens=12,
                           temperature=0)
        bad = pool.submit(httpx.post, server.url + "/v1/completions", timeout=60, headers={
            "Authorization": f"Bearer {KEY}"}, json={"model": MODEL, "prompt": "a", "max_tokens": 32,
                                                      "grammar": 'root ::= "a" root'})
        assert "Paris" in good.result(timeout=120).choices[0].text
        r = bad.result(timeout=120)
    assert r.status_code == 400 and "allows no next token" in r.json()["error"]["message"]
    after = server.assert_clean()
    assert after["kiln_constraint_dead_ends_total"] == before["kiln_constraint_dead_ends_total"] + 1
    assert after["kiln_constrained_requests_total"] > before["kiln_constrained_requests_total"]
    assert after["kiln_constraint_mask_seconds_count"] > before["kiln_constraint_mask_seconds_count"]
    assert after["kiln_engine_faults_total"] == 0
