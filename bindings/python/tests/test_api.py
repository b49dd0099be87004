"""The Python API: Router/start serve real pdrouter-mock workers and stop on request; the name
lists are the ones the flags take; the wheel is one abi3 wheel for CPython 3.9 and later."""

import gc
import os
import re
import socket
import struct
import sys
import threading
import time
import urllib.request
import zipfile
from pathlib import Path

import pytest

import pdrouter
from conftest import HELP_DIR, chat, free_port, pd_flags


def test_start_serves_and_stop_stops(mocks):
    router = pdrouter.start(pd_flags(*mocks), timeout=60)
    try:
        assert router.running
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+", router.url), router.url
        answer = chat(router.url)
        assert answer["choices"][0]["message"]["content"]
        with urllib.request.urlopen(router.metrics_url, timeout=10) as r:
            assert b"# TYPE" in r.read()
    finally:
        router.stop(timeout=30)
    assert not router.running and router.url is None and router.metrics_url is None


def test_the_router_is_closed_after_stop(mocks):
    port = free_port()
    flags = pd_flags(*mocks)
    flags[flags.index("--port") + 1] = str(port)
    with pdrouter.start(flags) as router:
        assert router.url == f"http://127.0.0.1:{port}"
        with urllib.request.urlopen(router.url + "/health", timeout=10) as r:
            assert r.status == 200
    # The with block stopped it: nothing listens on the port any more.
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    with pytest.raises(RuntimeError, match="stopped"):
        router.wait_ready(timeout=1)


def test_a_router_dropped_without_stop_stops(mocks):
    router = pdrouter.start(pd_flags(*mocks))
    port = int(router.url.rsplit(":", 1)[1])
    del router
    gc.collect()
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
        except ConnectionRefusedError:
            break
        assert time.monotonic() < deadline, "the dropped router still listens"
        time.sleep(0.05)


def test_routers_in_one_process_are_independent(mocks):
    first = pdrouter.start(pd_flags(*mocks))
    second = pdrouter.start(pd_flags(*mocks))
    try:
        assert first.url != second.url
        first.stop()
        assert chat(second.url)["choices"]
    finally:
        first.stop()
        second.stop()


def test_the_gil_is_free_while_waiting(mocks):
    # wait_ready() and stop() block in Rust; another Python thread must run meanwhile.
    router = pdrouter.Router(pd_flags(*mocks))
    ticks = []
    done = threading.Event()

    def tick():
        while not done.is_set():
            ticks.append(1)
            done.wait(0.001)

    t = threading.Thread(target=tick)
    t.start()
    try:
        router.wait_ready(timeout=60)
        router.stop(timeout=30)
    finally:
        done.set()
        t.join()
    assert ticks


def test_bad_flags_raise_the_binarys_message():
    with pytest.raises(ValueError) as e:
        pdrouter.Router(["--worker-urls", "http://127.0.0.1:1", "--policy", "nope"])
    assert str(e.value).startswith("--policy 'nope' is not a policy; use one of random")
    with pytest.raises(ValueError, match="unexpected argument '--no-such-flag'"):
        pdrouter.Router(["--no-such-flag"])
    with pytest.raises(ValueError, match="--cache-threshold"):
        pdrouter.Router(["--worker-urls", "http://127.0.0.1:1", "--cache-threshold", "2"])


def test_a_router_that_cannot_bind_raises(mocks):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    flags = pd_flags(*mocks)
    flags[flags.index("--port") + 1] = str(port)
    try:
        with pytest.raises(RuntimeError, match=f"cannot listen on 127.0.0.1:{port}"):
            pdrouter.start(flags)
    finally:
        taken.close()


def test_stop_abandons_a_start_that_waits_for_workers():
    # No worker answers on this port: told to wait for its workers (up to 10 minutes), the
    # router does not listen; stop() ends the wait.
    flags = ["--worker-urls", f"http://127.0.0.1:{free_port()}", "--host", "127.0.0.1",
             "--port", "0", "--prometheus-port", "0", "--log-level", "error",
             "--worker-startup-timeout-secs", "600"]
    router = pdrouter.Router(flags)
    with pytest.raises(TimeoutError):
        router.wait_ready(timeout=0.2)
    with pytest.raises(ValueError, match="timeout must be"):
        router.wait_ready(timeout=-1)
    began = time.monotonic()
    router.stop(timeout=30)
    assert time.monotonic() - began < 30
    assert not router.running
    with pytest.raises(RuntimeError, match="stopped"):
        router.wait_ready(timeout=1)


def help_list(flag):
    """The comma-separated names the golden launch help lists for `flag`."""
    lines = (HELP_DIR / "launch_help.txt").read_text().splitlines()
    at = next(i for i, l in enumerate(lines) if l.strip().startswith(flag + " "))
    # A long flag's description is on the line after it.
    line = lines[at] if ": " in lines[at] else lines[at + 1]
    names = line.split(": ", 1)[1].split(" [default")[0].rstrip(".")
    return [n.strip() for n in names.split(",")]


def test_the_name_lists_are_the_flags():
    assert pdrouter.tool_call_parsers() == help_list("--tool-call-parser")
    assert pdrouter.reasoning_parsers() == help_list("--reasoning-parser")
    assert pdrouter.policies() == help_list("--policy")


def test_the_wheel_is_abi3_for_cpython_39_and_later():
    wheel_dir = os.environ.get("PDROUTER_WHEEL_DIR")
    if not wheel_dir:
        pytest.fail("PDROUTER_WHEEL_DIR is not set (run bindings/python/run_tests.sh)")
    wheels = sorted(Path(wheel_dir).glob("pdrouter-*.whl"))
    assert len(wheels) == 1, wheels
    wheel = wheels[0]
    assert re.fullmatch(
        rf"pdrouter-{re.escape(pdrouter.__version__)}-cp39-abi3-[a-z0-9_.]+\.whl", wheel.name
    ), wheel.name
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        meta = z.read(f"pdrouter-{pdrouter.__version__}.dist-info/WHEEL").decode()
        entry_points = z.read(
            f"pdrouter-{pdrouter.__version__}.dist-info/entry_points.txt"
        ).decode()
    assert re.search(r"^Tag: cp39-abi3-", meta, re.M), meta
    assert "Root-Is-Purelib: false" in meta
    assert any(re.fullmatch(r"pdrouter/_pdrouter\.abi3\.so", n) for n in names), names
    for stub in ("pdrouter/py.typed", "pdrouter/_pdrouter.pyi", "pdrouter/launch_router.py"):
        assert stub in names
    assert re.search(r"^pdrouter\s*=\s*pdrouter:main$", entry_points, re.M), entry_points


def elf_needed(path):
    """The DT_NEEDED entries (shared libraries) of the ELF64 little-endian file at `path`."""
    data = Path(path).read_bytes()
    assert data[:6] == b"\x7fELF\x02\x01", "not an ELF64 little-endian file"
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = [
        struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)
    ]
    needed = []
    for _name, kind, _flags, _addr, offset, size, link, *_ in sections:
        if kind != 6:  # SHT_DYNAMIC; its sh_link is the string table's index
            continue
        strtab = sections[link][4]
        for at in range(offset, offset + size, 16):
            tag, value = struct.unpack_from("<qQ", data, at)
            if tag == 1:  # DT_NEEDED
                end = data.index(b"\0", strtab + value)
                needed.append(data[strtab + value:end].decode())
    return needed


@pytest.mark.skipif(sys.platform != "linux", reason="ELF check")
def test_the_extension_does_not_link_libpython():
    # A wheel's extension must take Python's symbols from the interpreter that loads it (the
    # abi3 promise, and manylinux's rule): maturin builds it without linking libpython.
    so = Path(pdrouter._pdrouter.__file__)
    assert so.name == "_pdrouter.abi3.so"
    needed = elf_needed(so)
    assert "libc.so.6" in needed, needed
    assert not any(n.startswith("libpython") for n in needed), needed
