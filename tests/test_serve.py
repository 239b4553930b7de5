"""kiln serve, end to end: a real server process on 127.0.0.1, driven by the real `openai` client
(and httpx where a test needs raw HTTP). Every wait is bounded."""
from __future__ import annotations

import concurrent.futures

import httpx
import numpy as np
import openai
import pytest

import compiler
from server_process import KEY, MODEL, Server

SYSTEM = ("You are a careful assistant for a museum of natural history. You answer visitors' questions about "
          "fossils, minerals, meteorites and the animals of every continent. Keep answers short and friendly, "
          "name the hall where the exhibit can be found when you know it, and never invent facts. ") * 3
QUESTIONS = ["Where are the dinosaurs?", "What is a trilobite?", "Do you have meteorites?", "What is amber?",
             "How old is the oldest fossil?", "Which mineral is the hardest?", "Where can I see a whale?",
             "What did mammoths eat?", "Is a bat a bird?", "What is obsidian?", "How big was T. rex?",
             "What is a geode?", "Why are flamingos pink?", "What is the largest crystal?",
             "Where do penguins live?", "What is a coelacanth?"]


@pytest.fixture(scope="module")
def server(smollm2):
    s = Server("--ctx", "1024", "--n-seq", "8", "--page-size", "16", "--api-key", KEY)
    yield s
    s.stop()


def _chat(client, question: str, max_tokens: int = 24, system: str = SYSTEM, **kw):
    return client.chat.completions.create(model=MODEL, messages=[{"role": "system", "content": system},
                                                                 {"role": "user", "content": question}],
                                          max_tokens=max_tokens, temperature=0, **kw)


# -- the API -------------------------------------------------------------------------------------
def test_completion_matches_the_python_api(server, smollm2):
    client = server.client()
    r = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=12, temperature=0)
    assert r.object == "text_completion" and r.model == MODEL
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 12
    m = compiler.load(smollm2, ctx=1024)
    ids = m.tokenize("The capital of France is")
    assert r.usage.prompt_tokens == len(ids)
    assert r.choices[0].text == m.generate(ids, max_tokens=12, temperature=0)


def test_streamed_and_whole_answers_agree(server):
    client = server.client()
    whole = _chat(client, QUESTIONS[0])
    assert whole.object == "chat.completion" and whole.choices[0].message.role == "assistant"
    assert whole.choices[0].finish_reason in ("stop", "length") and whole.choices[0].message.content
    chunks = list(_chat(client, QUESTIONS[0], stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == whole.choices[0].finish_reason
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens

    streamed = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=10, temperature=0,
                                         stream=True)
    plain = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=10, temperature=0)
    assert "".join(c.choices[0].text for c in streamed) == plain.choices[0].text


def test_models_health_and_sampling_options(server):
    client = server.client()
    assert [m.id for m in client.models.list()] == [MODEL]
    assert httpx.get(server.url + "/health").json() == {"status": "ok"}
    kw = dict(model=MODEL, prompt="List three colours:", max_tokens=16, temperature=0.9, top_p=0.9, seed=7,
              presence_penalty=0.5, frequency_penalty=0.3, extra_body={"top_k": 20, "min_p": 0.02,
                                                                        "repeat_penalty": 1.1})
    a, b = client.completions.create(**kw), client.completions.create(**kw)
    assert a.choices[0].text == b.choices[0].text  # a seed makes sampling repeatable
    stopped = client.completions.create(model=MODEL, prompt="1, 2, 3, 4,", max_tokens=20, temperature=0, stop=[" 7"])
    assert stopped.choices[0].finish_reason == "stop" and " 7" not in stopped.choices[0].text
    assert "6" in stopped.choices[0].text
    capped = _chat(client, QUESTIONS[1], max_tokens=None, extra_body={"max_completion_tokens": 5})
    assert capped.usage.completion_tokens == 5 and capped.choices[0].finish_reason == "length"


def test_logprobs_are_the_models(server, smollm2):
    client = server.client()
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=4,
                                       temperature=0, logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == 4
    for item in content:  # greedy: the sampled token is the most likely one
        assert len(item.top_logprobs) == 3 and item.top_logprobs[0].token == item.token
        assert item.logprob == pytest.approx(item.top_logprobs[0].logprob) and item.logprob <= 0
    m = compiler.load(smollm2, ctx=1024)
    from compiler.text.chat import render_chat
    logits = m.prefill(m.tokenize(render_chat(m.spec, [{"role": "user", "content": "Hi"}]))).astype(np.float64)
    logp = logits - logits.max() - np.log(np.exp(logits - logits.max()).sum())
    assert content[0].logprob == pytest.approx(logp.max(), abs=1e-6)
    assert [t.logprob for t in content[0].top_logprobs] == pytest.approx(np.sort(logp)[::-1][:3], abs=1e-6)

    c = client.completions.create(model=MODEL, prompt="Hello", max_tokens=3, temperature=0, logprobs=2)
    lp = c.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 3
    assert "".join(lp.tokens) == c.choices[0].text


# -- batching and the prefix cache ----------------------------------------------------------------
def test_concurrent_requests_give_what_each_gives_alone(server):
    client = server.client()
    alone = [_chat(client, q).choices[0].message.content for q in QUESTIONS]
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        together = list(pool.map(lambda q: _chat(client, q).choices[0].message.content, QUESTIONS))
    assert together == alone


def test_prefix_cache_hit_gives_the_cold_output(server):
    client = server.client()
    system = "You are a ship's navigator in the age of sail. " * 12  # a prompt no other test sends
    cold = _chat(client, "Which star guides us north?", system=system)
    assert cold.usage.prompt_tokens_details.cached_tokens == 0
    hot = _chat(client, "Which star guides us north?", system=system)
    assert hot.choices[0].message.content == cold.choices[0].message.content
    assert hot.usage.prompt_tokens_details.cached_tokens >= hot.usage.prompt_tokens - 16  # all but the last page
    other = _chat(client, "How do we find the longitude?", system=system)
    assert other.usage.prompt_tokens_details.cached_tokens >= other.usage.prompt_tokens - 40  # the system prompt
    assert server.metric("kiln_prefix_cache_hits_tokens_total") > 0


def test_a_client_that_disconnects_is_cancelled_and_its_pages_freed(server):
    server.wait_idle()
    before = server.metric("kiln_generation_tokens_total")
    body = {"model": MODEL, "prompt": "Write a long story about a lighthouse keeper.", "max_tokens": 800,
            "temperature": 0.7, "stream": True, "ignore_eos": True}  # uncancelled, it would run 800 tokens
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=300,
                      headers={"Authorization": f"Bearer {KEY}"}) as r:
        for i, _ in enumerate(r.iter_lines()):
            if i >= 10:
                break
    server.wait_idle(timeout=300)  # a bound on a hang: uncancelled, it would end idle at 800 tokens
    generated = server.metric("kiln_generation_tokens_total") - before
    assert generated < 400  # it stopped long before max_tokens
    # no sequence holds a page: whatever is in use is the prefix cache's
    assert server.metric("kiln_kv_pages_used") == server.metric("kiln_prefix_cache_pages")


# -- bad input -----------------------------------------------------------------------------------
BAD = [
    (b"{not json", 400, "not valid JSON"),
    (b'{"prompt": "x"}', 400, "model: Field required"),
    (b'{"model": "smollm2-135m", "prompt": 5}', 400, "prompt:"),
    (b'{"model": "smollm2-135m", "prompt": "x", "max_tokens": "5"}', 400, "max_tokens:"),
    (b'{"model": "gpt-4", "prompt": "x"}', 404, "model 'gpt-4' does not exist"),
    (b'{"model": "smollm2-135m", "prompt": "x", "max_tokens": 0}', 400, "max_tokens:"),
    (b'{"model": "smollm2-135m", "prompt": "x", "temperature": -0.5}', 400, "temperature:"),
    (b'{"model": "smollm2-135m", "prompt": "' + b"word " * 2000 + b'"}', 400, "context holds 1024"),
    (b'{"model": "smollm2-135m", "prompt": [1, 2, 99999999]}', 400, "token id 99999999 is out of range"),
    (b'{"model": "smollm2-135m", "prompt": "\xff\xfe"}', 400, "not valid UTF-8"),
    (b'{"model": "smollm2-135m", "prompt": "' + b"a" * (5 << 20) + b'"}', 413, "limit"),
    (b'[1, 2]', 400, "valid dictionary"),
]


@pytest.mark.parametrize("body,status,message", BAD, ids=[b[2] for b in BAD])
def test_bad_requests_get_openai_errors_and_the_server_keeps_serving(server, body, status, message):
    r = httpx.post(server.url + "/v1/completions", content=body, timeout=300,
                   headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert message in error["message"] and error["type"]
    assert server.client().completions.create(model=MODEL, prompt="Hi", max_tokens=1).choices[0].finish_reason


def test_bad_chat_requests(server):
    client = server.client()
    with pytest.raises(openai.BadRequestError, match="messages.0.role"):
        client.chat.completions.create(model=MODEL, messages=[{"role": "wizard", "content": "x"}])
    with pytest.raises(openai.BadRequestError, match="messages"):
        client.chat.completions.create(model=MODEL, messages=[])
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])


def test_api_key_is_required(server):
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0).models.list()
    assert httpx.post(server.url + "/v1/completions", json={"model": MODEL, "prompt": "x"}).status_code == 401
    assert httpx.get(server.url + "/metrics").status_code == 200  # scrapers and probes need no key


# -- a small pool: preemption and a full queue ------------------------------------------------------
@pytest.fixture(scope="module")
def small_server(smollm2):
    s = Server("--ctx", "512", "--n-seq", "4", "--page-size", "16", "--kv-pages", "24", "--max-queue", "6",
               "--api-key", KEY)
    yield s
    s.stop()


def test_preempted_requests_finish_with_their_own_output(small_server):
    client = small_server.client()
    prompts = [f"Once upon a time, {x}" for x in ("a dragon", "the sea", "a clock", "a fox")]

    def complete(p):
        r = client.completions.create(model=MODEL, prompt=p, max_tokens=120, temperature=0,
                                      extra_body={"repeat_penalty": 1.2, "ignore_eos": True})
        assert r.usage.completion_tokens == 120
        return r.choices[0].text

    alone = [complete(p) for p in prompts]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        together = list(pool.map(complete, prompts))
    assert small_server.metric("kiln_preemptions_total") > 0  # 4 x ~130 positions do not fit in 24 x 16
    assert together == alone


def test_a_full_queue_answers_503_and_the_server_recovers(small_server):
    body = {"model": MODEL, "prompt": "Count slowly:", "max_tokens": 40, "temperature": 0, "ignore_eos": True}
    headers = {"Authorization": f"Bearer {KEY}"}
    with concurrent.futures.ThreadPoolExecutor(24) as pool:
        replies = list(pool.map(lambda _: httpx.post(small_server.url + "/v1/completions", json=body,
                                                     headers=headers, timeout=120), range(24)))
    busy = [r for r in replies if r.status_code == 503]
    assert busy and all(r.headers["retry-after"] for r in busy)
    assert all(r.status_code == 200 for r in replies if r not in busy)
    small_server.wait_idle()
    assert httpx.post(small_server.url + "/v1/completions", json=body, headers=headers, timeout=60).status_code == 200


# -- KV state files over HTTP (llama-server's /slots) -------------------------------------------------
def test_slot_save_and_restore_carry_a_cache_to_another_server(tmp_path, smollm2):
    """A request's cache saved by one server and restored into a fresh one: the same request then
    reads its prompt from the prefix cache (cached_tokens) and answers as the first one did."""
    prompt = "Once upon a time, in a small village at the edge of a forest, there lived an old clockmaker who " * 4
    args = ("--ctx", "512", "--n-seq", "2", "--page-size", "16", "--slot-save-path", str(tmp_path))
    first = Server(*args)
    try:
        a = first.client().completions.create(model=MODEL, prompt=prompt, max_tokens=8, temperature=0)
        r = httpx.post(first.url + "/slots/0?action=save", json={"filename": "story.kv"}, timeout=60)
        assert r.status_code == 200, r.text
        saved = r.json()
        assert saved["id_slot"] == 0 and saved["filename"] == "story.kv"
        assert saved["n_saved"] >= a.usage.prompt_tokens and saved["n_written"] == (tmp_path / "story.kv").stat().st_size
    finally:
        first.stop()
    second = Server(*args)
    try:
        r = httpx.post(second.url + "/slots/1?action=restore", json={"filename": "story.kv"}, timeout=60)
        assert r.status_code == 200 and r.json()["n_restored"] == saved["n_saved"], r.text
        # the restored cache is slot 1's own: a request must name the slot to start from it
        other = second.client().completions.create(model=MODEL, prompt=prompt, max_tokens=8, temperature=0)
        assert other.usage.prompt_tokens_details.cached_tokens == 0
        b = second.client().completions.create(model=MODEL, prompt=prompt, max_tokens=8, temperature=0,
                                               extra_body={"id_slot": 1})
        cached = b.usage.prompt_tokens_details.cached_tokens
        assert cached >= (a.usage.prompt_tokens - 1) // 16 * 16 > 0 and b.choices[0].text == a.choices[0].text
        # a save does not overwrite unless asked
        r = httpx.post(second.url + "/slots/1?action=save", json={"filename": "story.kv"}, timeout=60)
        assert r.status_code == 400 and "overwrite" in r.json()["error"]["message"]
        r = httpx.post(second.url + "/slots/1?action=save", json={"filename": "story.kv", "overwrite": True}, timeout=60)
        assert r.status_code == 200, r.text
        bad = [("/slots/0?action=save", {"filename": "../escape.kv"}, 400, "filename"),
               ("/slots/0?action=save", {"filename": 7}, 400, "filename"),
               ("/slots/0?action=fly", {"filename": "x.kv"}, 400, "action"),
               ("/slots/9?action=save", {"filename": "x.kv"}, 400, "id_slot"),
               ("/slots/1?action=restore", {"filename": "absent.kv"}, 404, "absent.kv")]
        for url, body, status, word in bad:
            r = httpx.post(second.url + url, json=body, timeout=60)
            assert r.status_code == status and word in r.json()["error"]["message"], (url, r.text)
        (tmp_path / "broken.kv").write_bytes((tmp_path / "story.kv").read_bytes()[:-10])
        r = httpx.post(second.url + "/slots/0?action=restore", json={"filename": "broken.kv"}, timeout=60)
        assert r.status_code == 400 and "checksum" in r.json()["error"]["message"]
        assert second.client().completions.create(model=MODEL, prompt="Hi", max_tokens=2).usage  # still serving
    finally:
        second.stop()


def test_slots_are_off_without_a_save_path(server):
    r = httpx.post(server.url + "/slots/0?action=save", json={"filename": "x.kv"},
                   headers={"Authorization": f"Bearer {KEY}"}, timeout=300)
    assert r.status_code == 501 and "--slot-save-path" in r.json()["error"]["message"]
