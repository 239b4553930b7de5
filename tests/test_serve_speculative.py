"""kiln serve --spec ngram, end to end: a real server process driven by the real `openai` client.
Speculating requests share steps with plain ones (and with requests that opt out), and every
answer is the one plain decoding gives: the same text, and the same logprobs to the last bit (each
token's and the 20 likeliest, in float64 from the row of logits it was drawn from: a verification
row one ulp off anywhere moves them), against plain decoding run here one token a step."""
from __future__ import annotations

import concurrent.futures

import httpx
import numpy as np
import pytest

import compiler
from compiler.serving.protocol import completion_logprobs
from compiler.serving.types import TokenLogprob
from server_process import KEY, MODEL, Server

PASSAGE = ("Every morning the baker opened the shutters, swept the flour from the step, set out the bread in "
           "three neat rows, and chalked the price of each loaf on the slate beside the door.")
PROMPTS = [f"Copy the passage.\nPassage: {PASSAGE}\nCopy: Every morning the baker",
           f"Passage: {PASSAGE}\nQuestion: what did the baker chalk on the slate?\nAnswer: the baker chalked",
           "Once upon a time, in a land of tall mountains,",
           "def fibonacci(n):\n    if n < 2:\n        return n\n    return"]


@pytest.fixture(scope="module")
def server(smollm2):
    s = Server("--ctx", "1024", "--n-seq", "8", "--page-size", "16", "--api-key", KEY, "--spec", "ngram",
               "--spec-max-draft", "8")
    yield s
    s.stop()


MAX_TOKENS, TOP = 48, 20


def _complete(client, prompt: str, speculative: bool = True, **kw):
    return client.completions.create(model=MODEL, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0,
                                     extra_body={"speculative": speculative}, **kw)


def _plain_logprobs(m, prompt: str) -> list[tuple]:
    """Plain greedy decoding of `prompt` here, one token a step: the completion's logprobs as the
    server formats them, per token (its text, its logprob, the TOP likeliest by text)."""
    items = []
    m.reset()
    logits = m.prefill(m.prompt_ids(prompt))
    while len(items) < MAX_TOKENS:
        token = int(np.argmax(logits))
        if token in m.spec.tokenizer.eog_ids:
            break
        items.append(TokenLogprob.of(logits, token, TOP))
        if len(items) < MAX_TOKENS:
            logits = m.decode(token)
    lp = completion_logprobs(items, m.tokenizer.token_bytes, 0)
    return list(zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"]))


def test_speculating_beside_plain_requests_gives_plain_answers(server, smollm2):
    client = server.client()
    jobs = [(p, spec) for p in PROMPTS for spec in (True, False)]  # 8 at once: every slot busy
    with concurrent.futures.ThreadPoolExecutor(len(jobs)) as pool:
        answers = list(pool.map(lambda job: _complete(client, *job, logprobs=TOP).choices[0], jobs))
    m = compiler.load(smollm2, ctx=1024, threads=1)
    for (prompt, spec), answer in zip(jobs, answers):
        m.reset()
        assert answer.text == m.generate(prompt, max_tokens=MAX_TOKENS, temperature=0)
        got = list(zip(answer.logprobs.tokens, answer.logprobs.token_logprobs, answer.logprobs.top_logprobs))
        want = _plain_logprobs(m, prompt)
        bad = next((i for i, (g, w) in enumerate(zip(got, want)) if g != w), None)
        assert bad is None and len(got) == len(want), \
            f"{'speculating' if spec else 'plain'} request {prompt[:30]!r}, token {bad}: logprobs {got[bad]} " \
            f"where plain decoding's are {want[bad]}" if bad is not None else f"{len(got)} tokens, not {len(want)}"
    metrics = server.metrics()
    assert metrics["kiln_spec_accepted_tokens_total"] > 0
    assert metrics["kiln_spec_draft_tokens_total"] >= metrics["kiln_spec_accepted_tokens_total"]
    assert 0 < metrics["kiln_spec_acceptance_rate"] <= 1
    assert metrics["kiln_spec_tokens_per_step"] > 1  # the copying requests took several tokens a step
    server.assert_clean()


def test_streams_and_stops_are_plain_decodings(server):
    client = server.client()
    plain = _complete(client, PROMPTS[0], False)
    chunks = list(_complete(client, PROMPTS[1], stream=True))
    assert "".join(c.choices[0].text for c in chunks) == _complete(client, PROMPTS[1], False).choices[0].text
    stop = plain.choices[0].text[20:26]  # a stop string inside a run of accepted drafts
    assert _complete(client, PROMPTS[0], stop=stop).choices[0].text == \
        _complete(client, PROMPTS[0], False, stop=stop).choices[0].text
    server.assert_clean()


def test_the_opt_out_is_checked(server):
    r = httpx.post(server.url + "/v1/completions", headers={"Authorization": f"Bearer {KEY}"},
                   json={"model": MODEL, "prompt": "hi", "max_tokens": 2, "speculative": "no"}, timeout=30)
    assert r.status_code == 400 and "speculative" in r.text
