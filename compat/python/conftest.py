"""Fixtures: pdrouter with pdrouter-mock workers, started from the built binaries.

Each router and mock runs as a child process on a loopback port the OS picks (port 0); the
address is read from the line each binary prints at startup. Everything is stopped at the end
of the session, whatever the outcome.
"""

import json
import os
import queue
import subprocess
import threading
import time
import urllib.request
from dataclasses import dataclass, field

import pytest

API_KEY = "compat-key"
MODEL = "mock-model"
STARTUP_SECS = 30

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ROUTER_BIN = os.environ.get("PDROUTER_BIN", os.path.join(ROOT, "target", "debug", "pdrouter"))
MOCK_BIN = os.environ.get(
    "PDROUTER_MOCK_BIN", os.path.join(ROOT, "target", "debug", "pdrouter-mock")
)


class Proc:
    """A child process whose stdout lines are read by a thread into a queue."""

    def __init__(self, args):
        if not os.access(args[0], os.X_OK):
            raise RuntimeError(f"{args[0]} is not built (cargo build -p pdrouter -p pdrouter-mock)")
        self.args = args
        self.popen = subprocess.Popen(
            args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        self.lines = queue.Queue()
        self.seen = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.popen.stdout:
            self.lines.put(line.rstrip("\n"))

    def wait_for(self, prefix):
        """The rest of the first output line that starts with `prefix`."""
        deadline = time.monotonic() + STARTUP_SECS
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.2)
            except queue.Empty:
                if self.popen.poll() is not None:
                    break
                continue
            self.seen.append(line)
            if line.startswith(prefix):
                return line[len(prefix):]
        self.stop()
        raise RuntimeError(f"{self.args} did not print {prefix!r}; output: {self.seen}")

    def stop(self):
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()


def start_mock(role, *extra):
    p = Proc([MOCK_BIN, "--role", role, "--host", "127.0.0.1", "--port", "0", *extra])
    url = p.wait_for("pdrouter-mock listening on ").split()[0]
    return p, url


@dataclass
class Setup:
    """A PD router over one Prefill and one Decode mock."""

    url: str
    metrics_url: str
    prefill_url: str
    decode_url: str
    procs: list = field(default_factory=list)

    @property
    def base_url(self):
        return self.url + "/v1"

    def stop(self):
        for p in reversed(self.procs):
            p.stop()

    def metric(self, name):
        """Sum of every sample of metric `name` (any labels)."""
        with urllib.request.urlopen(self.metrics_url, timeout=10) as r:
            text = r.read().decode()
        total = 0.0
        for line in text.splitlines():
            if line.startswith("#"):
                continue
            key, _, value = line.rpartition(" ")
            if key == name or key.startswith(name + "{"):
                total += float(value)
        return total


def mock_post(url, path, body):
    req = urllib.request.Request(
        url + path,
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read() or b"null")


def mock_stats(url):
    with urllib.request.urlopen(url + "/mock/stats", timeout=10) as r:
        return json.loads(r.read())


def start_pd(*router_flags):
    procs = []
    try:
        prefill, prefill_url = start_mock("prefill")
        procs.append(prefill)
        decode, decode_url = start_mock("decode", "--output-tokens", "8")
        procs.append(decode)
        router = Proc(
            [
                ROUTER_BIN,
                "launch",
                "--pd-disaggregation",
                "--prefill", prefill_url, "none",
                "--decode", decode_url,
                "--host", "127.0.0.1",
                "--port", "0",
                "--prometheus-host", "127.0.0.1",
                "--prometheus-port", "0",
                "--api-key", API_KEY,
                "--log-level", "warn",
                *router_flags,
            ]
        )
        procs.append(router)
        url = router.wait_for("pdrouter listening on ")
        metrics_url = router.wait_for("pdrouter metrics on ")
        return Setup(url, metrics_url, prefill_url, decode_url, procs)
    except BaseException:
        for p in reversed(procs):
            p.stop()
        raise


@pytest.fixture(scope="session")
def pd():
    """The router most tests use: PD over HTTP mocks, an API key, no admission limit."""
    s = start_pd()
    yield s
    s.stop()


@pytest.fixture(scope="session")
def limited():
    """A router whose one Prefill worker takes one request and queues none: the next is 429."""
    s = start_pd(
        "--prefill-max-inflight-requests-per-worker", "1",
        "--prefill-queue-size", "0",
        "--prefill-queue-timeout-secs", "0",
    )
    yield s
    s.stop()


@pytest.fixture(scope="session")
def demo():
    """`pdrouter demo` (its own embedded mocks, admission on), without the start-up burst."""
    p = Proc([ROUTER_BIN, "demo", "--port", "0", "--burst", "false"])
    try:
        # The line goes on after the URL (e.g. "(HTTP workers)").
        url = p.wait_for("pdrouter demo: PD router on ").split()[0]
        yield url
    finally:
        p.stop()
