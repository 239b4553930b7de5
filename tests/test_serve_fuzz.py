"""The HTTP API fuzzed with hypothesis against a real `kiln serve` process (the real app, engine and
model, no mocks): wild bodies, which test validation, and near-sound ones, which reach the engine,
on every route. Whatever the body, the answer is a 2xx or a 4xx (never a 500), and afterwards the
server is clean: nothing running or waiting, no pages in use but the prefix cache's (and a
restored slot's), no engine faults. Every BESIDE-th case runs beside a good streamed request, which
has shown its first token when the case is sent and must end with its solo output, bit for bit. A
case with no answer in HANG seconds has hung, and the fuzz as a whole is bounded too. The first case
that fails stops the fuzz and is reported as sent (a server left dirty would fail every case after
it, so hypothesis is not asked to shrink it). `make test` runs KILN_HTTP_FUZZ_CASES examples
(default 300); set it higher for the long run."""
from __future__ import annotations

import json
import os
import time

import httpx
import pytest
from hypothesis import HealthCheck, example, given, settings, strategies as st

from server_process import HANG, MODEL, Server, Streamed, assert_same_stream

CASES = int(os.environ.get("KILN_HTTP_FUZZ_CASES", "300"))
# seconds for the whole fuzz, a bound on a hang: a case takes well under a second, a few on a loaded machine
FUZZ_HANG = 60 + 4 * CASES
PAGE = 16
COUNT = "Count: " + ", ".join(map(str, range(1, 21)))  # a prompt of several pages
ENDLESS = 'root ::= "a" root'  # llguidance's limit on a step's work ends it after a token: a dead end
BESIDE = 10  # every BESIDE-th case runs beside a good request (which costs its tokens)
GOOD = {"model": MODEL, "prompt": "The capital of France is", "max_tokens": 8, "ignore_eos": True, "temperature": 0,
        "logprobs": 1}

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

# Near-sound bodies, which reach the engine (most of the wild ones above stop at validation): a request
# for a few tokens, with up to three fields of its own, most of them valid, some plausibly wrong.
tool = st.fixed_dictionaries({"type": st.just("function"), "function": st.fixed_dictionaries(
    {"name": st.sampled_from(["f", "get_weather"])}, optional={"parameters": st.sampled_from([
        {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}, {"type": "object"}])})})
sampling = {
    "temperature": st.floats(0, 2), "top_p": st.floats(0, 1), "top_k": st.integers(0, 100), "min_p": st.floats(0, 1),
    "repeat_penalty": st.floats(0.5, 2), "presence_penalty": st.floats(-2, 2), "frequency_penalty": st.floats(-2, 2),
    "seed": st.integers(-1, 2**32), "stop": st.text(max_size=3) | st.lists(st.text(max_size=3), max_size=3),
    "stream": st.booleans(), "ignore_eos": st.booleans(), "id_slot": st.integers(0, 2),
    "logprobs": st.integers(0, 3) | st.booleans(), "top_logprobs": st.integers(0, 3),
    "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}),
    "logit_bias": st.dictionaries(st.integers(-1, 49152).map(str), st.floats(-100, 100), max_size=3),
}
constraints = {  # one at most: two are a 400 before the engine sees them
    "grammar": st.sampled_from(['root ::= "a"', ENDLESS, 'root ::= [a-z]+ "."', "root ::= missing"]),
    "regex": st.sampled_from(["[0-9]+", "(yes|no)", "[^\\s\\S]", "a{99999}"]),
    "json_schema": st.sampled_from([{"type": "object"}, {"type": "integer"}, {"enum": ["a", "b"]}, {"enum": []}]),
    "response_format": st.sampled_from([{"type": "text"}, {"type": "json_object"}, {"type": "json_schema"}, {
        "type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "array", "items": {"type": "null"}}}}]),
    "tools": st.lists(tool, min_size=1, max_size=2),
    "tool_choice": plausible["tool_choice"],
}
some_extras = st.tuples(st.lists(st.sampled_from(sorted(sampling)), max_size=2, unique=True),
                        st.sampled_from([None, *sorted(constraints)])).flatmap(lambda t: st.fixed_dictionaries(
                            {**{k: sampling[k] for k in t[0]}, **({t[1]: constraints[t[1]]} if t[1] else {})}))
turns = st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant"]),
                                        "content": st.text(min_size=1, max_size=40)}), min_size=1, max_size=3)
sound = {
    "/v1/completions": st.fixed_dictionaries({"model": st.just(MODEL), "max_tokens": st.integers(1, 4), "prompt":
                                              st.text(min_size=1, max_size=40) | st.lists(st.integers(-1, 49152),
                                                                                          min_size=1, max_size=8)}),
    "/v1/chat/completions": st.fixed_dictionaries({"model": st.just(MODEL), "max_tokens": st.integers(1, 4),
                                                   "messages": turns}),
}
near_sound = {route: st.tuples(base, some_extras).map(lambda t: {**t[0], **t[1]}) for route, base in sound.items()}
near_sound |= {route: st.fixed_dictionaries({"filename": st.sampled_from(["a.kv", "b.kv"]) | st.text(max_size=12)},
                                            optional={"overwrite": st.booleans()}) for route in ROUTES[2:]}
raw = st.sampled_from([False, False, True])  # True: the body's JSON text reversed
cases = st.sampled_from(ROUTES).flatmap(lambda route: st.tuples(  # two near-sound bodies to one wild
    st.just(route), st.one_of(near_sound[route], near_sound[route], bodies), raw))


@pytest.fixture(scope="module")
def srv(smollm2, tmp_path_factory):
    s = Server("--ctx", "256", "--n-seq", "2", "--page-size", str(PAGE), "--max-queue", "8", "--max-tokens", "8",
               "--slot-save-path", str(tmp_path_factory.mktemp("slots")), "--slot-max-bytes", str(1 << 24))
    s.solo = Streamed(s, GOOD).chunks()
    yield s
    s.stop()


class Fuzz:
    """The fuzz's state across cases: the first failure (which stops it), and the pages each slot's
    restored cache holds (they are the slot's own until the next restore into it)."""

    def __init__(self, srv: Server):
        self.srv, self.started, self.cases = srv, time.monotonic(), 0
        self.failed: str | None = None
        self.restored: dict[str, int] = {}

    def case(self, route: str, content: bytes, beside: bool) -> None:
        srv = self.srv
        good = Streamed(srv, GOOD).running() if beside else None
        try:
            r = srv.http.post(srv.url + route, content=content, headers={"Content-Type": "application/json"})
        except httpx.TimeoutException as e:
            raise AssertionError(f"no answer in {HANG} s: a hang ({type(e).__name__})") from None
        assert r.status_code < 500 or r.status_code == 503, f"{r.status_code}: {r.text}"
        if r.status_code >= 400:
            assert "error" in r.json(), r.text
        if route.endswith("action=restore") and r.status_code == 200:
            self.restored[route] = r.json()["n_restored"] // PAGE
        if good is not None:
            assert_same_stream(good.chunks(), srv.solo, "the good request beside it")
        srv.assert_clean(private_pages=sum(self.restored.values()))


@settings(max_examples=CASES, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(case=cases)
# first, the paths inside the engine that random bodies seldom reach: a slot's cache saved, saved again
# over itself and restored from a file that is not there (both fail on the engine thread), restored
# into another slot (whose own pages it then holds) and read by a request naming that slot; and a
# constraint's dead end while generating, whole and streamed
@example(case=("/v1/completions", {"model": MODEL, "prompt": COUNT, "max_tokens": 1, "id_slot": 0}, False))
@example(case=("/slots/0?action=save", {"filename": "a.kv"}, False))
@example(case=("/slots/0?action=save", {"filename": "a.kv"}, False))
@example(case=("/slots/1?action=restore", {"filename": "none.kv"}, False))
@example(case=("/slots/1?action=restore", {"filename": "a.kv"}, False))
@example(case=("/v1/completions", {"model": MODEL, "prompt": COUNT, "max_tokens": 2, "id_slot": 1}, False))
@example(case=("/v1/completions", {"model": MODEL, "prompt": "a", "max_tokens": 4, "grammar": ENDLESS}, False))
@example(case=("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "a"}], "max_tokens": 4,
                                        "stream": True, "grammar": ENDLESS}, False))
def _fuzz(fuzz: Fuzz, case):
    route, body, raw = case
    if fuzz.failed:
        return
    text = json.dumps(body, allow_nan=True)
    content = (text[::-1] if raw else text).encode("utf-8", errors="surrogatepass")
    fuzz.cases += 1
    beside = fuzz.cases % BESIDE == 0
    try:
        assert time.monotonic() - fuzz.started < FUZZ_HANG, f"the fuzz has run {FUZZ_HANG} s: a hang"
        fuzz.case(route, content, beside)
    except (AssertionError, httpx.HTTPError, json.JSONDecodeError) as e:  # (a server that died: ConnectError)
        fuzz.failed = (f"case {fuzz.cases} (POST {route} {content[:2000]!r}"
                       f"{', beside a good request' if beside else ''}): {type(e).__name__}: {e}")


def test_no_body_makes_a_500_or_a_hang_or_a_leak(srv):
    fuzz = Fuzz(srv)
    _fuzz(fuzz)
    if fuzz.failed:
        pytest.fail(fuzz.failed, pytrace=False)
    assert fuzz.cases >= CASES, f"only {fuzz.cases} cases ran"
