"""A real `kiln serve` process on 127.0.0.1 for the server tests: started, polled until healthy,
read through /metrics, stopped. Every wait is bounded."""
from __future__ import annotations

import os
import re
import socket
import subprocess
import tempfile
import sys
import time

import httpx
import openai

MODEL = "smollm2-135m"
KEY = "test-key"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, *args: str, env: dict | None = None, metrics_key: str | None = None):
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.metrics_headers = {"Authorization": f"Bearer {metrics_key}"} if metrics_key else {}
        self.output = tempfile.TemporaryFile("w+")  # a file, not a pipe: a full pipe would stall the server
        self.proc = subprocess.Popen([sys.executable, "-m", "compiler", "serve", MODEL, "--port", str(self.port),
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
        return openai.OpenAI(base_url=self.url + "/v1", api_key=key, timeout=120, max_retries=0, **kw)

    def metric(self, name: str) -> float:
        text = httpx.get(self.url + "/metrics", timeout=10, headers=self.metrics_headers).text
        return float(re.search(rf"^{name} (\S+)$", text, re.M).group(1))

    def wait_idle(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while self.metric("kiln_requests_running") or self.metric("kiln_requests_waiting"):
            assert time.monotonic() < deadline, "requests still running"
            time.sleep(0.1)

    def log(self) -> str:
        self.output.seek(0)
        return self.output.read()

    def metrics(self) -> dict[str, float]:
        text = httpx.get(self.url + "/metrics", timeout=10, headers=self.metrics_headers).text
        return {m.group(1): float(m.group(2)) for m in re.finditer(r"^(kiln_\w+) (\S+)$", text, re.M)}

    def assert_clean(self, timeout: float = 60) -> dict[str, float]:
        """Healthy, nothing running or waiting, and no pages in use but the prefix cache's: nothing
        leaked. The metrics, for more checks."""
        deadline = time.monotonic() + timeout
        while True:
            m = self.metrics()
            idle = not m["kiln_requests_running"] and not m["kiln_requests_waiting"]
            if idle and m["kiln_kv_pages_used"] == m["kiln_prefix_cache_pages"]:
                break
            assert time.monotonic() < deadline, f"not idle: {m}"
            time.sleep(0.1)
        assert httpx.get(self.url + "/health", timeout=10).status_code == 200
        assert self.proc.poll() is None
        return m

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
