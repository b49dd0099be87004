"""The launchers: the console script, `python -m pdrouter` and `python -m
pdrouter.launch_router` print what the binary prints and exit as it does, with the router
running inside the Python process."""

import os
import signal
import socket
import subprocess
import sys
import textwrap

import pytest

import pdrouter
from conftest import (
    HELP_DIR,
    ROUTER_BIN,
    Proc,
    chat,
    free_port,
    pd_flags,
    python_m,
    run,
    script,
)


@pytest.mark.parametrize(
    "launcher, args, golden",
    [
        ("script", ["--help"], "help.txt"),
        ("script", ["launch", "--help"], "launch_help.txt"),
        ("module", ["-h"], "h.txt"),
        ("module", ["demo", "--help"], "demo_help.txt"),
        ("launch_router", ["--help"], "launch_help.txt"),
        ("launch_router", ["-h"], "launch_h.txt"),
    ],
)
def test_help_is_the_binarys_golden_text(launcher, args, golden):
    cmd = {
        "script": [script("pdrouter")],
        "module": python_m("pdrouter"),
        "launch_router": python_m("pdrouter.launch_router"),
    }[launcher]
    out = run(cmd + args)
    assert out.returncode == 0, out.stderr
    assert out.stdout == (HELP_DIR / golden).read_text()


def test_version_is_the_crates_and_the_packages():
    from importlib.metadata import version

    out = run(python_m("pdrouter", "--version"))
    assert out.returncode == 0, out.stderr
    assert out.stdout == f"pdrouter {pdrouter.__version__}\n"
    assert pdrouter.__version__ == version("pdrouter")


# Command lines the binary refuses with exit code 2: a configuration rule, a numeric range,
# clap's own usage error, and a flag of SMG's that pdrouter does not take.
BAD_LINES = [
    ["--worker-urls", "http://127.0.0.1:1", "--policy", "nope"],
    ["--worker-urls", "http://127.0.0.1:1", "--cache-threshold", "2"],
    ["launch", "--worker-urls", "http://127.0.0.1:1", "--max-payload-size", "-1"],
    ["--no-such-flag"],
    ["bogus-subcommand"],
]


@pytest.mark.parametrize("args", BAD_LINES)
def test_argument_errors_exit_2_with_the_binarys_message(args):
    got = run(python_m("pdrouter", *args))
    assert got.returncode == 2, got
    assert got.stderr.startswith("error: "), got.stderr
    assert got.stdout == ""
    if os.access(ROUTER_BIN, os.X_OK):
        want = run([ROUTER_BIN, *args])
        assert want.returncode == 2
        assert got.stderr == want.stderr
    else:
        pytest.fail(f"{ROUTER_BIN} is not built (cargo build -p pdrouter): nothing to compare")


def test_a_bad_value_is_one_line():
    got = run(python_m("pdrouter", "--worker-urls", "http://127.0.0.1:1", "--policy", "nope"))
    assert got.returncode == 2
    lines = got.stderr.splitlines()
    assert len(lines) == 1, got.stderr
    assert lines[0].startswith("error: --policy 'nope' is not a policy; use one of random")


def test_launch_router_takes_launchs_flags():
    got = run(python_m("pdrouter.launch_router", "--policy", "nope", "--worker-urls", "http://x:1"))
    assert got.returncode == 2
    assert got.stderr.startswith("error: --policy 'nope' is not a policy"), got.stderr


def test_a_router_that_cannot_start_exits_1(mocks):
    # The port is taken by a listener of ours: the router cannot bind it.
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    try:
        flags = pd_flags(*mocks)
        flags[flags.index("--port") + 1] = str(port)
        got = run(python_m("pdrouter", *flags))
    finally:
        taken.close()
    assert got.returncode == 1, got
    assert f"cannot listen on 127.0.0.1:{port}" in got.stderr


@pytest.mark.parametrize(
    "launcher, sig",
    [
        ("module", signal.SIGTERM),
        ("module", signal.SIGINT),
        ("script", signal.SIGTERM),
        ("launch_router", signal.SIGINT),
    ],
)
def test_a_signal_shuts_the_router_down_gracefully(mocks, launcher, sig):
    cmd = {
        "module": python_m("pdrouter", "launch"),
        "script": [script("pdrouter")],
        "launch_router": python_m("pdrouter.launch_router"),
    }[launcher]
    router = Proc(cmd + pd_flags(*mocks, log_level="info"))
    try:
        url = router.wait_for("pdrouter listening on ")
        router.wait_for("pdrouter metrics on ")
        assert chat(url)["choices"][0]["message"]["content"]
        router.popen.send_signal(sig)
        assert router.wait() == 0
        # The graceful path, not a kill: the router logged its shutdown.
        assert any("stopped" in line for line in router.seen), router.seen
        assert not any("Traceback" in line for line in router.seen), router.seen
    finally:
        router.stop()


def test_run_releases_the_gil_while_it_serves(mocks):
    # The command runs in a thread of a Python program whose main thread keeps running
    # Python code: it polls the router, sends a request through it, then SIGTERM to its own
    # process. Were the GIL held by run(), the main thread could not do any of it.
    port = free_port()
    flags = pd_flags(*mocks)
    flags[flags.index("--port") + 1] = str(port)
    program = textwrap.dedent(
        f"""
        import json, os, signal, sys, threading, time, urllib.request
        import pdrouter
        url = "http://127.0.0.1:{port}"
        codes = []
        t = threading.Thread(target=lambda: codes.append(pdrouter.main(sys.argv[1:])))
        t.start()
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(url + "/health", timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or not t.is_alive():
                    sys.exit("the router did not come up")
                t.join(0.05)
        body = json.dumps({{"model": "mock-model", "max_tokens": 4,
                           "messages": [{{"role": "user", "content": "hi"}}]}}).encode()
        req = urllib.request.Request(url + "/v1/chat/completions", data=body,
                                     headers={{"content-type": "application/json"}})
        with urllib.request.urlopen(req, timeout=30) as r:
            print("status", r.status, flush=True)
        os.kill(os.getpid(), signal.SIGTERM)
        t.join(30)
        print("code", codes, flush=True)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", program, "launch", *flags],
        capture_output=True, text=True, timeout=120,
    )
    assert out.returncode == 0, out
    assert "status 200" in out.stdout, out
    assert "code [0]" in out.stdout, out
