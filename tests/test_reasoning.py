"""A reasoning model's thinking apart from its answer (text/reasoning.py, serving/reasoning.py), on
outputs in each format and on the real chat templates of llama.cpp's test set (Qwen3, Qwen3.5, the
DeepSeek-R1 distills, gpt-oss: `make vocab` unpacks them from the llama-cpp-python sdist).

Streamed and whole agree: the parts a stream hands out, fed the text in pieces of every size,
join to what `split` gives the whole text. The server's side with the real `openai` client is in
test_serve_reasoning.py."""
from __future__ import annotations

import json

import pytest

from compiler.serving.reasoning import ChatStream, Reasoning, ReasoningFields
from compiler.serving.tools import Calls
from compiler.text.chat import _environment
from compiler.text.reasoning import Format, ReasoningStream, format_of, opens_in_thinking, split
from means import skip_for_want_of
from test_tokenizer_suites import NAMED, SUITES

TEMPLATES = SUITES / "templates"

THINK = "<think>\nThe user adds 2 and 2.\n</think>\n\nThe answer is 4."
THINK_OPEN = "The user adds 2 and 2.\n</think>\n\nThe answer is 4."  # the prompt opened the section
HARMONY = ("<|channel|>analysis<|message|>The user adds 2 and 2.<|end|><|start|>assistant<|channel|>final"
           "<|message|>The answer is 4.<|return|>")
HARMONY_CALL = ("<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>commentary "
                'to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}<|call|>')
HARMONY_CALL_FIRST = ('<|channel|>analysis<|message|>Need it.<|end|><|start|>assistant to=functions.get_weather'
                      '<|channel|>commentary json<|message|>{"city": "Oslo"}<|call|>')
CASES = {  # (text, format, opened by the prompt) -> (reasoning, content, calls)
    "think": ((THINK, Format.THINK, False), ("The user adds 2 and 2.\n", "The answer is 4.", [])),
    "think opened by the prompt": ((THINK_OPEN, Format.THINK, True), ("The user adds 2 and 2.\n", "The answer is 4.", [])),
    "no thinking": (("  The answer is 4.", Format.THINK, False), ("", "  The answer is 4.", [])),
    "cut off while thinking": (("<think>\nStill going", Format.THINK, False), ("Still going", "", [])),
    "harmony": ((HARMONY, Format.HARMONY, False), ("The user adds 2 and 2.", "The answer is 4.", [])),
    "harmony call": ((HARMONY_CALL, Format.HARMONY, False), ("Need the weather.", "",
                                                            [("get_weather", '{"city": "Paris"}')])),
    "harmony call, recipient first": ((HARMONY_CALL_FIRST, Format.HARMONY, False),
                                      ("Need it.", "", [("get_weather", '{"city": "Oslo"}')])),
    "no format": ((THINK, Format.NONE, False), ("", THINK, [])),
}


@pytest.mark.parametrize("case", list(CASES))
def test_split_whole_and_streamed_in_pieces_of_every_size(case):
    (text, fmt, opened), (reasoning, content, calls) = CASES[case]
    whole = split(text, fmt, opened)
    assert (whole.reasoning, whole.content, whole.calls) == (reasoning, content, calls)
    for size in range(1, 12):
        stream, parts = ReasoningStream(fmt, opened), []
        for i in range(0, len(text), size):
            parts += stream.push(text[i:i + size])
        parts += stream.finish()
        got = ("".join(p for k, p in parts if k == "reasoning"), "".join(p for k, p in parts if k == "content"),
               [p for k, p in parts if k == "call"])
        assert got == (reasoning, content, calls), size
        # nothing of a marker leaks out while it is still being written
        assert fmt is Format.NONE or not any(m in p for k, p in parts if k != "call" for m in ("<think", "</think", "<|end", "<|chan"))


def _template(name: str) -> str:
    path = TEMPLATES / name
    if not path.is_file():
        if NAMED:
            pytest.fail(f"{path}: `make vocab` unpacks llama.cpp's chat templates there")
        skip_for_want_of(f"llama.cpp's chat templates at {TEMPLATES}", "`make vocab` unpacks them", apt=False)
    return path.read_text()


def _render(source: str, **variables) -> str:
    return _environment().from_string(source).render(messages=[{"role": "user", "content": "What is 2 + 2?"}],
                                                     add_generation_prompt=True, bos_token="", eos_token="",
                                                     **variables)


@pytest.mark.parametrize("name, fmt, opens, opens_off", [
    ("Qwen3.5-4B.jinja", Format.THINK, True, False),
    ("Qwen-Qwen3-0.6B.jinja", Format.THINK, False, False),  # the model writes <think> itself
    ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", Format.THINK, True, False),
    ("openai-gpt-oss-120b.jinja", Format.HARMONY, False, False),
    ("Qwen-Qwen2.5-7B-Instruct.jinja", Format.NONE, False, False),
])
def test_the_real_templates_format_and_where_the_output_starts(name, fmt, opens, opens_off):
    """Qwen3.5's generation prompt opens the section, and with enable_thinking false closes it
    empty; Qwen3's leaves it to the model; gpt-oss speaks in channels; Qwen2.5 does not think.
    enable_thinking is true unless a request says otherwise, as llama-server passes it (llama.cpp's
    R1 template closes the section at once where the variable is undefined)."""
    source = _template(name)
    assert format_of(source) is fmt
    assert opens_in_thinking(fmt, _render(source, **ReasoningFields().template_kwargs())) is opens
    assert opens_in_thinking(fmt, _render(source, enable_thinking=False)) is opens_off


def test_reasoning_effort_reaches_gpt_oss_template():
    source = _template("openai-gpt-oss-120b.jinja")
    fields = ReasoningFields(reasoning_effort="high")
    assert "Reasoning: high" in _render(source, **fields.template_kwargs())
    assert "Reasoning: medium" in _render(source)  # its default


@pytest.mark.parametrize("kwargs, words", [
    ({"messages": []}, "'messages' is the server's to set"),
    ({"add_generation_prompt": False}, "'add_generation_prompt' is the server's"),
    ({f"k{i}": i for i in range(33)}, "at most 32 variables"),
    ({"big": "x" * 5000}, "at most 4096 bytes"),
])
def test_template_variables_are_bounded_and_never_the_servers_own(kwargs, words):
    with pytest.raises(ValueError, match=words):
        ReasoningFields(chat_template_kwargs=kwargs).template_kwargs()


def test_a_harmony_answer_and_its_calls_as_the_api_returns_them():
    """message: content and reasoning_content apart; the call a tool_call with its arguments, its
    finish_reason tool_calls; streamed, the same in deltas."""
    r = Reasoning(Format.HARMONY, False, True)
    message, finish = r.message(HARMONY_CALL, "stop", Calls())
    assert finish == "tool_calls" and message["reasoning_content"] == "Need the weather." and message["content"] is None
    (call,) = message["tool_calls"]
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    stream = ChatStream(r, Calls())
    deltas = [d for i in range(0, len(HARMONY_CALL), 7) for d in stream.push(HARMONY_CALL[i:i + 7])]
    deltas += stream.push("", final=True)
    assert "".join(d.get("reasoning_content", "") for d in deltas) == "Need the weather."
    calls = [c for d in deltas for c in d.get("tool_calls", [])]
    assert stream.called and [c["function"]["name"] for c in calls] == ["get_weather"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Paris"}


def test_reasoning_format_none_leaves_the_thinking_in_the_content():
    r = Reasoning.of(_template("Qwen3.5-4B.jinja"), "<|im_start|>assistant\n<think>\n", "none")
    assert r.open_at_start and not r.apart
    assert r.message(THINK_OPEN, "stop", None)[0] == {"role": "assistant", "content": THINK_OPEN}


class _Terminal:
    def __init__(self, tty: bool):
        self.text, self.tty = "", tty

    def write(self, s: str) -> None:
        self.text += s

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return self.tty


@pytest.mark.parametrize("tty", [True, False])
def test_the_terminal_shows_the_thinking_dimmed_apart_from_the_answer(tty):
    from compiler.cli.thinking import DIM, RESET, ThinkingView

    out = _Terminal(tty)
    view = ThinkingView(Format.THINK, False, out)
    for i in range(0, len(THINK), 3):
        view.write(THINK[i:i + 3])
    view.write("", final=True)
    dim, reset = (DIM, RESET) if tty else ("", "")
    assert out.text == f"{dim}The user adds 2 and 2.\n{reset}\n\nThe answer is 4."


def test_xml_calls_read_and_streamed_whole():
    from compiler.serving.tools import ToolStream, message_of
    from compiler.text.tool_calls_xml import split_xml_call

    functions = {"f": {"name": "f", "parameters": {"properties": {"s": {"type": "string"}, "n": {"type": "integer"}}}}}
    text = "Calling.\n<tool_call>\n<function=f>\n<parameter=s>\n42\n</parameter>\n<parameter=n>\n42\n</parameter>\n" \
           "</function>\n</tool_call>"
    assert split_xml_call(text.split("<tool_call>")[1].split("</tool_call>")[0], functions) == \
        ("f", '{"s": "42", "n": 42}')  # the schema types each value
    calls = Calls(True, functions)
    message, finish = message_of(text, "stop", calls)
    assert message["content"] == "Calling." and finish == "tool_calls"
    assert message["tool_calls"][0]["function"] == {"name": "f", "arguments": '{"s": "42", "n": 42}'}
    stream = ToolStream(calls)
    deltas = [d for i in range(0, len(text), 5) for d in stream.push(text[i:i + 5])] + stream.finish()
    assert "".join(d.get("content", "") for d in deltas) == "Calling."
    (call,) = [c for d in deltas for c in d.get("tool_calls", [])]
    assert call["function"] == {"name": "f", "arguments": '{"s": "42", "n": 42}'}


def test_the_ray_apps_reasoning_settings_are_checked():
    from compiler.core.errors import KilnError
    from compiler.serving.ray_settings import settings_from_args

    s = settings_from_args({"model": "smollm2-135m", "reasoning_format": "none", "reasoning_budget": -1})
    assert (s.server.reasoning_format, s.server.reasoning_budget) == ("none", -1)
    for bad, words in (({"reasoning_format": "maybe"}, "'auto' or 'none'"), ({"reasoning_budget": -2}, "got -2")):
        with pytest.raises(KilnError, match=words):
            settings_from_args({"model": "smollm2-135m", **bad})
