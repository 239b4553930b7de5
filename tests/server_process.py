"""A real `kiln serve` process on 127.0.0.1 for the server tests: started, polled until healthy,
read through /metrics, stopped; and a streamed request read on a thread of its own, to run other
requests beside. Every wait is bounded, by HANG: a bound on a hang, never on speed (a 2-core
machine shared with other work is slow, not stuck)."""
from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import tempfile
import sys
import threading
import time

import httpx
import openai

MODEL = "smollm2-135m"
KEY = "test-key"
HANG = 120  # seconds


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, *args: str, env: dict | None = None, metrics_key: str | None = None, model: str = MODEL):
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.model = str(model)
        self.metrics_headers = {"Authorization": f"Bearer {metrics_key}"} if metrics_key else {}
        self.http = httpx.Client(timeout=HANG)  # keeps its connections: the checks between requests are cheap
        self.output = tempfile.TemporaryFile("w+")  # a file, not a pipe: a full pipe would stall the server
        self.proc = subprocess.Popen([sys.executable, "-m", "compiler", "serve", str(model), "--port", str(self.port),
                                      *args], stdout=self.output, stderr=subprocess.STDOUT, text=True,
                                     env={**os.environ, **(env or {})})
        deadline = time.monotonic() + 300  # a first run compiles the library
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"kiln serve exited: {self.log()}")
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.5)
        self.stop()
        raise TimeoutError("kiln serve did not come up")

    def client(self, key: str = KEY, **kw) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key=key, timeout=HANG, max_retries=0, **kw)

    def metric(self, name: str) -> float:
        return self.metrics()[name]

    def wait_idle(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while self.metric("kiln_requests_running") or self.metric("kiln_requests_waiting"):
            assert time.monotonic() < deadline, "requests still running"
            time.sleep(0.1)

    def log(self) -> str:
        self.output.seek(0)
        return self.output.read()

    def metrics(self) -> dict[str, float]:
        text = self.http.get(self.url + "/metrics", headers=self.metrics_headers).text
        return {m.group(1): float(m.group(2)) for m in re.finditer(r"^(kiln_\w+) (\S+)$", text, re.M)}

    def assert_clean(self, timeout: float = HANG, private_pages: int = 0) -> dict[str, float]:
        """Healthy, no engine faults, nothing running or waiting, and no pages in use but the prefix
        cache's (and `private_pages`, held by the slots' restored caches): nothing leaked. The
        metrics, for more checks."""
        deadline = time.monotonic() + timeout
        while True:
            m = self.metrics()
            idle = not m["kiln_requests_running"] and not m["kiln_requests_waiting"]
            if idle and m["kiln_kv_pages_used"] == m["kiln_prefix_cache_pages"] + private_pages:
                break
            assert time.monotonic() < deadline, (
                f"not clean after {timeout} s: {m['kiln_requests_running']:.0f} requests running, "
                f"{m['kiln_requests_waiting']:.0f} waiting (queue slots held), {m['kiln_kv_pages_used']:.0f} pages "
                f"in use where the prefix cache holds {m['kiln_prefix_cache_pages']:.0f} and restored slots "
                f"{private_pages}")
            time.sleep(0.1)
        assert m["kiln_engine_faults_total"] == 0, f"engine faults: {m}"
        assert self.http.get(self.url + "/health").status_code == 200
        assert self.proc.poll() is None
        return m

    def stop(self) -> None:
        self.http.close()
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class Streamed:
    """A streamed (SSE) request, read on a thread of its own. `running()` waits until its first
    chunk has come, so that what is sent next runs beside a request that is generating; `chunks()`
    waits for the rest: every data chunk's choices, in order (what a client sees, bit for bit)."""

    def __init__(self, server: Server, body: dict, path: str = "/v1/completions", headers: dict | None = None):
        self.what = f"the streamed request beside ({body.get('prompt')!r})"
        self._choices: list[list[dict]] = []
        self._error: str | None = None
        self._first, self._done = threading.Event(), threading.Event()
        self._thread = threading.Thread(target=self._read, args=(server.url + path, body, headers), daemon=True)
        self._thread.start()

    def _read(self, url: str, body: dict, headers: dict | None) -> None:
        try:  # a read that waits longer than HANG for the next bytes is a hang
            with httpx.stream("POST", url, json={**body, "stream": True}, headers=headers, timeout=HANG) as r:
                if r.status_code != 200:
                    self._error = f"{r.status_code}: {r.read()!r}"
                    return
                for line in r.iter_lines():
                    if line.startswith("data: {"):
                        chunk = json.loads(line[len("data: "):])
                        if "error" in chunk:
                            self._error = f"an error in the stream: {chunk}"
                            return
                        self._choices.append(chunk["choices"])
                        self._first.set()
        except httpx.HTTPError as e:
            self._error = f"{type(e).__name__}: {e}"
        finally:
            self._first.set()
            self._done.set()

    def running(self) -> "Streamed":
        assert self._first.wait(HANG), f"{self.what} showed no chunk in {HANG} s"
        assert self._error is None, f"{self.what} failed: {self._error}"
        assert not self._done.is_set(), f"{self.what} ended before anything was sent beside it: make it longer"
        return self

    def chunks(self) -> list[list[dict]]:
        assert self._done.wait(HANG * 2), f"{self.what} hung"  # each read is bounded by HANG; the whole, near it
        assert self._error is None, f"{self.what} failed: {self._error}"
        return self._choices


def text_of(chunks: list[list[dict]]) -> str:
    return "".join(c.get("text") or c.get("delta", {}).get("content") or "" for choices in chunks for c in choices)


def assert_same_stream(got: list[list[dict]], alone: list[list[dict]], where: str) -> None:
    """A stream is its solo self, bit for bit: the same chunks, text and logprobs."""
    same_text = " (the same text: its logprobs differ)" if text_of(got) == text_of(alone) else ""
    assert got == alone, f"{where}: {text_of(got)!r}; alone: {text_of(alone)!r}{same_text}"
