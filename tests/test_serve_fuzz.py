"""The HTTP API fuzzed with hypothesis, in-process (the real app, engine and model, no mocks):
whatever the body, the answer is a 2xx or a 4xx, never a 500 and never a hang. `make test` runs
KILN_HTTP_FUZZ_CASES examples (default 300); set it higher for the long run."""
from __future__ import annotations

import json
import os

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import compiler

MODEL = "smollm2-135m"
CASES = int(os.environ.get("KILN_HTTP_FUZZ_CASES", "300"))

FIELDS = ["model", "prompt", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k",
          "min_p", "repeat_penalty", "presence_penalty", "frequency_penalty", "seed", "stop", "stream",
          "stream_options", "logprobs", "top_logprobs", "n", "echo", "ignore_eos", "id_slot", "filename", "overwrite",
          "response_format", "grammar", "json_schema", "regex", "logit_bias", "tools", "tool_choice",
          "parallel_tool_calls"]
ROUTES = ["/v1/completions", "/v1/chat/completions", "/slots/0?action=save", "/slots/1?action=restore"]

scalars = (st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=True, allow_infinity=True)
           | st.text(max_size=40) | st.sampled_from([MODEL, "user", "system", "text", "", "\ud800", "<|im_start|>"]))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                                            max_size=4), max_leaves=12)
messages = st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant", "tool", 7]),
                                           "content": st.text(max_size=60) | values}), min_size=0, max_size=3)
plausible = {"model": st.just(MODEL) | values, "prompt": st.text(max_size=80) | values, "messages": messages | values,
             "max_tokens": st.integers(-2, 8) | values, "stream": st.booleans() | values,
             "temperature": st.floats(0, 2) | values, "top_k": st.integers(-5, 2**63) | values}
schemas = st.sampled_from([{"type": "object"}, {"type": "strnig"}, {"$ref": "#/nowhere"}, {"enum": []}, {}]) | values
plausible |= {
    "grammar": st.sampled_from(['root ::= "a"', "root ::= missing", 'root ::= "a" root', "", "start: /[0-9]+/"])
    | st.text(max_size=40) | values,
    "regex": st.sampled_from(["[0-9]+", "[^\\s\\S]", "(", "a{99999}"]) | st.text(max_size=20) | values,
    "json_schema": schemas,
    "response_format": st.fixed_dictionaries({"type": st.sampled_from(["text", "json_object", "json_schema", 5])},
                                             optional={"json_schema": st.fixed_dictionaries({}, optional={
                                                 "name": st.text(max_size=8), "schema": schemas}) | values,
                                                 "schema": schemas}) | values,
    "logit_bias": st.dictionaries(st.integers(-3, 60000).map(str) | st.text(max_size=6), st.floats() | values,
                                  max_size=3) | values,
    "tools": st.lists(st.fixed_dictionaries({"type": st.just("function"), "function": st.fixed_dictionaries(
        {"name": st.sampled_from(["f", "get_weather", "bad name"]) | st.text(max_size=10)},
        optional={"parameters": schemas})}), max_size=2) | values,
    "tool_choice": st.sampled_from(["auto", "none", "required", {"type": "function", "function": {"name": "f"}}])
    | values,
}
bodies = st.fixed_dictionaries({}, optional={f: plausible.get(f, values) for f in FIELDS}) | values


@pytest.fixture(scope="module")
def client(smollm2, tmp_path_factory):
    from fastapi.testclient import TestClient

    from compiler.serving.engine import Engine
    from compiler.serving.http import ServerConfig
    from compiler.serving.server import create_app

    m = compiler.load(smollm2, ctx=256, n_seq=2, page_size=16)
    engine = Engine(m, max_queue=8).start()
    config = ServerConfig(MODEL, max_tokens=8, request_timeout=60,
                          slot_save_path=tmp_path_factory.mktemp("slots"), slot_max_bytes=1 << 24)
    with TestClient(create_app(engine, config), raise_server_exceptions=False) as c:
        yield c, engine
    engine.stop()


@settings(max_examples=CASES, deadline=60_000, database=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
@given(route=st.sampled_from(ROUTES), body=bodies, raw=st.booleans())
def _fuzz(client, route, body, raw):
    c, engine = client
    content = json.dumps(body, allow_nan=True).encode("utf-8", errors="surrogatepass") if not raw else \
        json.dumps(body, allow_nan=True)[::-1].encode("utf-8", errors="surrogatepass")
    r = c.post(route, content=content, headers={"Content-Type": "application/json"})
    assert r.status_code < 500 or r.status_code == 503, (route, body, r.status_code, r.text)
    if r.status_code >= 400:
        assert "error" in r.json(), r.text


def test_no_body_makes_a_500_or_a_hang(client):
    _fuzz(client)
    c, engine = client
    assert engine.alive and engine.faults == 0
    r = c.post("/v1/completions", json={"model": MODEL, "prompt": "Hello", "max_tokens": 2, "temperature": 0})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2
