"""Reasoning in `kiln serve`, with the real `openai` client: a synthetic Qwen3 model (random weights,
SmolLM2's tokenizer) carrying Qwen3.5's real chat template (from llama.cpp's test set), whose
generation prompt opens a thinking section. A random model never closes it itself, so every token
is thinking until a reasoning budget forces `</think>`: the budget is what these tests turn, and
it shows each part of the feature to the token.

- reasoning_content and content apart, whole and streamed, the same text either way;
- the budget honoured to the token: the first N output tokens are the thinking, the next ones the
  forced marker, the rest the answer (read from the tokens' logprobs);
- enable_thinking false (chat_template_kwargs): the template closes the section, all is content;
- json_schema holds the answer and not the thinking: the thinking's tokens are those of the same
  request without a schema, and the answer conforms;
- bad reasoning fields are 400s naming the field."""
from __future__ import annotations

import json

import httpx
import pytest

from server_process import KEY, Server
from test_reasoning import _template

ALIAS = "thinker"
ASK = [{"role": "user", "content": "What is 2 + 2?"}]
CLOSE = "</think>"


@pytest.fixture(scope="module")
def server(tiny, smollm2):
    path = tiny("qwen3", n_layer=2, n_embd=64, n_head=4, n_head_kv=2, n_ff=128, untied=True, tokenizer_from=smollm2,
                chat_template=_template("Qwen3.5-4B.jinja"))
    s = Server("--ctx", "512", "--n-seq", "4", "--api-key", KEY, "--alias", ALIAS, model=str(path))
    yield s
    s.stop()


def _ask(server, stream: bool = False, **extra):
    return server.client().chat.completions.create(model=ALIAS, messages=ASK, max_tokens=24, temperature=0,
                                                   stream=stream, extra_body=extra or None)


def _tokens(choice) -> list[str]:
    return [bytes(t.bytes).decode("utf-8", errors="replace") for t in choice.logprobs.content]


def _streamed(server, **extra) -> tuple[str, str, str | None]:
    reasoning, content, finish = "", "", None
    for chunk in _ask(server, stream=True, **extra):
        for c in chunk.choices:
            d = c.delta.model_extra or {}
            reasoning += d.get("reasoning_content") or ""
            content += c.delta.content or ""
            finish = c.finish_reason or finish
    return reasoning, content, finish


@pytest.mark.parametrize("budget", [0, 1, 6])
def test_the_budget_to_the_token_and_the_parts_whole_and_streamed(server, budget):
    whole = server.client().chat.completions.create(model=ALIAS, messages=ASK, max_tokens=24, temperature=0,
                                                    logprobs=True, extra_body={"reasoning_budget": budget})
    choice = whole.choices[0]
    tokens = _tokens(choice)
    n_close = next(k for k in range(1, len(tokens) - budget + 1) if "".join(tokens[budget:budget + k]) == CLOSE)
    reasoning = choice.message.model_extra["reasoning_content"]
    assert (reasoning or "") == "".join(tokens[:budget])
    assert choice.message.content == "".join(tokens[budget + n_close:]).lstrip()
    assert CLOSE not in (choice.message.content or "") and CLOSE not in (reasoning or "")
    assert _streamed(server, reasoning_budget=budget) == (reasoning or "", choice.message.content,
                                                          choice.finish_reason)


def test_without_a_budget_everything_is_thinking(server):
    """The negative control of the budget: the random model never writes the marker itself."""
    r = _ask(server).choices[0].message
    assert r.model_extra["reasoning_content"] and r.content == ""


def test_enable_thinking_false_leaves_no_thinking(server):
    r = _ask(server, chat_template_kwargs={"enable_thinking": False}).choices[0].message
    assert r.model_extra.get("reasoning_content") is None and r.content


def test_json_schema_holds_the_answer_not_the_thinking(server):
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
              "additionalProperties": False}
    fmt = {"type": "json_schema", "json_schema": {"name": "a", "schema": schema}}
    free = _ask(server, reasoning_budget=5).choices[0].message
    held = server.client().chat.completions.create(model=ALIAS, messages=ASK, max_tokens=48, temperature=0,
                                                   response_format=fmt, extra_body={"reasoning_budget": 5})
    message = held.choices[0].message
    assert message.model_extra["reasoning_content"] == free.model_extra["reasoning_content"]
    assert set(json.loads(message.content)) == {"a"} and held.choices[0].finish_reason == "stop"


def test_json_schema_holds_an_answer_without_thinking(server):
    """enable_thinking false: the template closes the section in the prompt, so the constraint
    holds the output from its first token (were it left waiting for a `</think>` that never comes,
    the random model's text would not parse)."""
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
              "additionalProperties": False}
    held = server.client().chat.completions.create(
        model=ALIAS, messages=ASK, max_tokens=48, temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": schema}},
        extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    message = held.choices[0].message
    assert message.model_extra.get("reasoning_content") is None and set(json.loads(message.content)) == {"a"}


@pytest.mark.parametrize("extra, field, words", [
    ({"reasoning_budget": -1}, "reasoning_budget", "greater than or equal to 0"),
    ({"reasoning_effort": "extreme"}, "reasoning_effort", "low"),
    ({"chat_template_kwargs": {"messages": []}}, "chat_template_kwargs", "the server's to set"),
    ({"chat_template_kwargs": ["enable_thinking"]}, "chat_template_kwargs", "dictionary"),
])
def test_bad_reasoning_fields_are_400s_naming_the_field(server, extra, field, words):
    body = {"model": ALIAS, "messages": ASK, "max_tokens": 4, **extra}
    r = httpx.post(server.url + "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {KEY}"},
                   timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == field and words in err["message"], err


def test_kiln_run_chat_shows_the_thinking_apart_and_no_think_skips_it(server):
    """`kiln run --chat`: the reply's thinking without its markers (here all of it: the random model
    never closes the section); with --no-think the template closes it in the prompt, and the same
    greedy reply is then another text."""
    import subprocess
    import sys

    def run(*more):
        p = subprocess.run([sys.executable, "-m", "compiler", "run", server.model, "--chat", "-p", "What is 2 + 2?",
                            "-n", "8", "--temp", "0", "--ctx", "512", *more], capture_output=True, text=True, timeout=600)
        assert p.returncode == 0, p.stderr
        return p.stdout
    thinking, plain = run(), run("--no-think")
    assert thinking.strip() and plain.strip() and thinking != plain
    assert not any(m in thinking + plain for m in ("<think>", "</think>"))
    with pytest.raises(AssertionError, match="--no-think: only with --chat"):
        p = subprocess.run([sys.executable, "-m", "compiler", "run", server.model, "-p", "x", "--no-think"],
                           capture_output=True, text=True, timeout=600)
        assert p.returncode == 0, p.stderr


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]},
                                                    "days": {"type": "integer", "minimum": 1, "maximum": 9}},
                   "required": ["city", "days"], "additionalProperties": False}}}


@pytest.mark.parametrize("stream", [False, True])
def test_qwen35s_xml_calls_after_the_thinking_whole_and_streamed(server, stream):
    """Qwen3.5's template teaches its XML calls (<function=...><parameter=...>); with tools the
    output is held to that format once the thinking ends, and its call comes back as OpenAI's
    tool_calls with JSON arguments typed by the schema (days an integer)."""
    r = server.client().chat.completions.create(
        model=ALIAS, messages=[{"role": "user", "content": "Weather in Paris for 3 days?"}], max_tokens=64,
        temperature=0, tools=[WEATHER], tool_choice="required", stream=stream, extra_body={"reasoning_budget": 3})
    if stream:
        calls, finish = {}, None
        for chunk in r:
            for c in chunk.choices:
                for t in c.delta.tool_calls or []:
                    calls.setdefault(t.index, ["", ""])
                    calls[t.index][0] += t.function.name or ""
                    calls[t.index][1] += t.function.arguments or ""
                finish = c.finish_reason or finish
        (name, arguments), = calls.values()
    else:
        choice = r.choices[0]
        finish, (call,) = choice.finish_reason, choice.message.tool_calls
        name, arguments = call.function.name, call.function.arguments
        assert choice.message.model_extra["reasoning_content"]
    args = json.loads(arguments)
    assert finish == "tool_calls" and name == "get_weather", (finish, name)
    assert set(args) == {"city", "days"} and args["city"] in ("Paris", "Oslo") and isinstance(args["days"], int)


def test_a_call_and_its_result_go_back_through_qwen35s_template(server):
    """The next turn: the assistant's call (its arguments an object, as transformers passes them to
    the template's `arguments|items`) and the tool's result, rendered by the real template."""
    messages = [{"role": "user", "content": "Weather in Paris for 3 days?"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "call_1", "type": "function",
                     "function": {"name": "get_weather", "arguments": '{"city": "Paris", "days": 3}'}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 21 C"}]
    r = server.client().chat.completions.create(model=ALIAS, messages=messages, max_tokens=4, temperature=0,
                                                tools=[WEATHER])
    assert r.usage.prompt_tokens > 60 and r.choices[0].finish_reason in ("length", "stop")
