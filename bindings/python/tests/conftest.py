"""Fixtures for the pdrouter package's suite: pdrouter-mock workers and child processes.

The package under test is the installed wheel (run_tests.sh installs it into a private venv),
not the source tree. Mocks and routers listen on loopback ports the OS picks (port 0); each
address is read from the line the process prints at startup. Every wait polls with a
deadline; nothing sleeps for a fixed time.
"""

import json
import os
import queue
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
TARGET = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
MOCK_BIN = Path(os.environ.get("PDROUTER_MOCK_BIN", TARGET / "debug" / "pdrouter-mock"))
# The binary, when built: its output is what the Python launchers must reproduce.
ROUTER_BIN = Path(os.environ.get("PDROUTER_BIN", TARGET / "debug" / "pdrouter"))
HELP_DIR = ROOT / "crates" / "pdrouter" / "tests" / "fixtures" / "help"
STARTUP_SECS = 60
MODEL = "mock-model"


def env_without_columns():
    """The environment with COLUMNS removed, as the golden help files were written."""
    env = dict(os.environ)
    env.pop("COLUMNS", None)
    return env


class Proc:
    """A child process whose stdout and stderr lines a thread reads into a queue."""

    def __init__(self, args):
        self.args = [str(a) for a in args]
        self.popen = subprocess.Popen(
            self.args,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env_without_columns(),
        )
        self.lines = queue.Queue()
        self.seen = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.popen.stdout:
            self.lines.put(line.rstrip("\n"))

    def wait_for(self, prefix, secs=STARTUP_SECS):
        """The rest of the first output line starting with `prefix`."""
        deadline = time.monotonic() + secs
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.2)
            except queue.Empty:
                if self.popen.poll() is not None and self.lines.empty():
                    break
                continue
            self.seen.append(line)
            if line.startswith(prefix):
                return line[len(prefix):]
        self.stop()
        raise AssertionError(f"{self.args} did not print {prefix!r}; output: {self.seen}")

    def wait(self, secs=30):
        """The exit code, within `secs`; then every line printed is in `seen`."""
        code = self.popen.wait(timeout=secs)
        self.reader.join(secs)
        while not self.lines.empty():
            self.seen.append(self.lines.get())
        return code

    def stop(self):
        if self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait()


def start_mock(role, *extra):
    if not os.access(MOCK_BIN, os.X_OK):
        pytest.fail(f"{MOCK_BIN} is not built (cargo build -p pdrouter-mock)")
    p = Proc([MOCK_BIN, "--role", role, "--host", "127.0.0.1", "--port", "0", *extra])
    return p, p.wait_for("pdrouter-mock listening on ").split()[0]


@pytest.fixture
def mocks():
    """A Prefill and a Decode mock: their URLs."""
    started = []
    try:
        prefill, prefill_url = start_mock("prefill")
        started.append(prefill)
        decode, decode_url = start_mock("decode", "--output-tokens", "4")
        started.append(decode)
        yield prefill_url, decode_url
    finally:
        for p in started:
            p.stop()


def pd_flags(prefill_url, decode_url, log_level="warn"):
    """`launch` flags for a PD router over the two mocks, on loopback ports the OS picks."""
    return [
        "--pd-disaggregation",
        "--prefill", prefill_url, "none",
        "--decode", decode_url,
        "--host", "127.0.0.1",
        "--port", "0",
        "--prometheus-host", "127.0.0.1",
        "--prometheus-port", "0",
        "--log-level", log_level,
    ]


def free_port():
    """A loopback port nothing listens on (for a test that must know it in advance)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def chat(url):
    """A chat completion through the router at `url`: the parsed JSON answer."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    req = urllib.request.Request(
        url + "/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        assert r.status == 200
        return json.loads(r.read())


def python_m(*args):
    """`python -m ...` with this interpreter (the venv's, where the wheel is installed)."""
    return [sys.executable, "-m", *args]


def script(name):
    """The console script `name` the wheel installed beside this interpreter."""
    path = Path(sys.executable).parent / name
    assert path.exists(), f"{path} is not installed (pip install the wheel)"
    return str(path)


def run(args, **kw):
    return subprocess.run(
        [str(a) for a in args], capture_output=True, text=True, timeout=60,
        env=env_without_columns(), **kw,
    )
