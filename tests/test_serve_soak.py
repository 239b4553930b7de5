"""A soak of the real server: 16 clients for a bounded time (KILN_SOAK_SECONDS: 30 in make test,
600 in make fuzz) mixing normal, streamed, cancelled, slow-reading, oversized and malformed
requests. Afterwards nothing has leaked (pages, queue slots, threads), the resident size stayed
within a bound, and every normal request's output was its solo output, bit for bit."""
from __future__ import annotations

import collections
import concurrent.futures
import json
import os
import random
import socket
import time
from pathlib import Path

import httpx
import pytest
from anyio._backends._asyncio import WorkerThread

from server_process import KEY, MODEL, Server

SECONDS = float(os.environ.get("KILN_SOAK_SECONDS", "30"))
CLIENTS = 16
PROMPTS = [f"Question {i}: what is {i} plus {i + 1}? Answer:" for i in range(8)]
KINDS = ["normal", "streamed", "cancelled", "slow", "oversized", "malformed"]
RSS_BOUND = 128 << 20  # bytes the server may grow by after its warm-up


def _rss(pid: int) -> int:
    pages = int(Path(f"/proc/{pid}/statm").read_text().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE")


def _threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


@pytest.fixture(scope="module")
def soaked(smollm2):
    s = Server("--ctx", "512", "--n-seq", "4", "--page-size", "16", "--max-queue", "64", "--max-tokens", "32",
               "--max-body-bytes", "65536", "--api-key", KEY)
    yield s
    s.stop()


def test_soak(soaked):
    s = soaked
    headers = {"Authorization": f"Bearer {KEY}"}
    solo = {p: httpx.post(s.url + "/v1/completions", json={"model": MODEL, "prompt": p, "max_tokens": 16,
                                                           "temperature": 0}, headers=headers,
                          timeout=120).json()["choices"][0]["text"] for p in PROMPTS}
    base_threads = _threads(s.proc.pid)
    counts: collections.Counter[str] = collections.Counter()
    wrong: list[str] = []

    def one(rng: random.Random) -> None:
        kind, prompt = rng.choice(KINDS), rng.choice(PROMPTS)
        body = {"model": MODEL, "prompt": prompt, "max_tokens": 16, "temperature": 0}
        if kind == "normal":
            r = httpx.post(s.url + "/v1/completions", json=body, headers=headers, timeout=120)
            ok = r.status_code == 200 and r.json()["choices"][0]["text"] == solo[prompt]
        elif kind in ("streamed", "slow"):
            text = []
            with httpx.stream("POST", s.url + "/v1/completions", json={**body, "stream": True}, headers=headers,
                              timeout=120) as r:
                for line in r.iter_lines():
                    if kind == "slow":
                        time.sleep(0.05)
                    if line.startswith("data: {"):
                        text.append(json.loads(line[6:])["choices"][0]["text"])
            ok = r.status_code == 200 and "".join(text) == solo[prompt]
        elif kind == "cancelled":
            raw = json.dumps({**body, "stream": rng.random() < 0.5}).encode()
            with socket.create_connection(("127.0.0.1", s.port), timeout=30) as sock:
                sock.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {KEY}\r\n"
                             f"Content-Type: application/json\r\nContent-Length: {len(raw)}\r\n\r\n".encode() + raw)
                time.sleep(rng.uniform(0, 0.2))
            ok = True
        elif kind == "oversized":
            r = httpx.post(s.url + "/v1/completions", json={**body, "prompt": "x" * 70_000}, headers=headers, timeout=60)
            ok = r.status_code == 413
        else:
            r = httpx.post(s.url + "/v1/completions", content=b'{"model": ' + bytes([rng.randrange(256)]) * 20,
                           headers={**headers, "Content-Type": "application/json"}, timeout=60)
            ok = r.status_code == 400
        counts[kind] += 1
        if not ok:
            wrong.append(kind)

    def client(i: int) -> None:
        rng = random.Random(i)
        while time.monotonic() < end:
            one(rng)

    start = time.monotonic()
    end = start + SECONDS
    warm_rss = warm_threads = None
    with concurrent.futures.ThreadPoolExecutor(CLIENTS) as pool:
        futures = [pool.submit(client, i) for i in range(CLIENTS)]
        time.sleep(min(15, SECONDS / 4))
        warm_rss, warm_threads = _rss(s.proc.pid), _threads(s.proc.pid)
        for f in futures:
            f.result(timeout=SECONDS + 300)
    m = s.assert_clean()
    grown = _rss(s.proc.pid) - warm_rss
    print(f"soak: {sum(counts.values())} requests in {time.monotonic() - start:.0f} s: {dict(counts)}; "
          f"RSS grew {grown / 2**20:.1f} MiB after the warm-up; threads {warm_threads} -> {_threads(s.proc.pid)}; "
          f"KV pages in use {m['kiln_kv_pages_used']:.0f} (the prefix cache's {m['kiln_prefix_cache_pages']:.0f})")
    assert not wrong, collections.Counter(wrong)
    assert all(counts[k] for k in KINDS) and m["kiln_engine_faults_total"] == 0
    assert grown < RSS_BOUND
    # The server tokenizes in anyio's worker threads, one per request in flight, which it keeps while
    # idle and retires at the pool's next use once they have been idle MAX_IDLE_TIME. So after that
    # long, one more request leaves the worker it needs and nothing else: a thread that leaked stays,
    # and is counted against the server's threads before the soak.
    time.sleep(WorkerThread.MAX_IDLE_TIME + 1)
    assert httpx.post(s.url + "/v1/completions", json={"model": MODEL, "prompt": PROMPTS[0], "max_tokens": 1},
                      headers=headers, timeout=60).status_code == 200
    assert _threads(s.proc.pid) <= base_threads + 1, (base_threads, warm_threads, _threads(s.proc.pid))
