"""The other way models call tools: Qwen3.5's and Qwen3-Coder's XML, which their chat templates
teach instead of tool_calls.py's JSON. Each call is

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    </function>
    </tool_call>

a parameter's value written as text: a string as it is, any other type as JSON. A template that
shows the model this format (`uses_xml_calls`) has its calls constrained and read in it; the
arguments come back as OpenAI's JSON text.
"""
from __future__ import annotations

import json
import re

FUNCTION = re.compile(r"\s*<function=([^>\n]+)>(.*?)</function>\s*$", re.S)
PARAMETER = re.compile(r"<parameter=([^>\n]+)>\n?(.*?)\n?</parameter>", re.S)


def uses_xml_calls(template: str) -> bool:
    return "<function=" in template and "<parameter=" in template


def _value(text: str, schema: dict | None):
    """A parameter's text as its JSON value: a string where the schema says so (or nothing else
    parses), else the JSON it spells."""
    if (schema or {}).get("type") == "string":
        return text
    try:
        return json.loads(text)
    except ValueError:
        return text


def split_xml_call(block: str, functions: dict[str, dict] | None = None) -> tuple[str, str] | None:
    """A call block's (name, arguments JSON text), or None if it is not a call; `functions` (name ->
    OpenAI's function object) gives each parameter's type."""
    m = FUNCTION.match(block)
    if m is None:
        return None
    name = m.group(1).strip()
    props = ((functions or {}).get(name, {}).get("parameters") or {}).get("properties") or {}
    args = {k.strip(): _value(v, props.get(k.strip())) for k, v in PARAMETER.findall(m.group(2))}
    return name, json.dumps(args, ensure_ascii=False)


def _literal(text: str) -> str:
    """A lark string literal (JSON's escapes are lark's)."""
    return json.dumps(text, ensure_ascii=False)


def xml_call_rules(i: int, function: dict) -> list[str]:
    """The lark rules of one function's call (`<function=...>` to `</function>`), rule `fn_<i>`:
    its parameters in the schema's order, the required ones mandatory; a string's text without
    `<` (one of its enum's words, where it has one), any other type JSON of its schema."""
    params = function.get("parameters") or {}
    props, required = params.get("properties") or {}, set(params.get("required") or [])
    parts, rules = [], []
    for j, (pname, schema) in enumerate(props.items()):
        value = f"v_{i}_{j}"
        schema = schema or {}
        if schema.get("type") == "string" and isinstance(schema.get("enum"), list):  # one of its words
            rules.append(f"{value}: {' | '.join(_literal(str(w)) for w in schema['enum'])}")
        elif schema.get("type") == "string":
            rules.append(f"{value}: /[^<]*/")
        else:
            rules.append(f"{value}: %json {json.dumps(schema)}")
        item = f"{_literal(f'<parameter={pname}>' + NL)} {value} {_literal(NL + '</parameter>' + NL)}"
        parts.append(item if pname in required else f"({item})?")
    head = _literal(f"<function={function['name']}>" + NL)
    return [f"fn_{i}: {head} {' '.join(parts)} {_literal('</function>')}", *rules]


NL = "\n"
