#!/usr/bin/env python3
"""Router memory per queued waiter (target: <= 10 KB of router RSS per waiter).

Starts a Prefill mock whose requests take 10 minutes, a Decode mock, and a release router
with admission (limit 1, queue big enough), parks N real client connections in the
admission queue, and reads the router's VmRSS before, while parked, and after the clients
hang up (queue drained). Prints a table and one key=value line.

Usage: bench/queue_memory.py [--waiters 10000]   (run from the repository root after
`cargo build --release -p pdrouter -p pdrouter-mock`). Needs only python3 (stdlib).
"""
import argparse
import os
import asyncio
import re
import subprocess
import sys
import time
import urllib.request

ROOT = subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True).stdout.strip() or "."


def start(cmd, env=None):
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    line = p.stdout.readline()
    m = re.search(r"http://([0-9.]+:[0-9]+)", line)
    if not m:
        raise SystemExit(f"could not start {cmd[0]}: {line!r}")
    return p, m.group(1)


def rss_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def metric(addr, name):
    text = urllib.request.urlopen(f"http://{addr}/metrics", timeout=5).read().decode()
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


BODY = b'{"model":"mock-model","messages":[{"role":"user","content":"park me in the queue please"}]}'


IDLE = False


async def client(addr, stop):
    host, port = addr.split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    if IDLE:
        await stop.wait()
        writer.close()
        return
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n"
        + f"content-length: {len(BODY)}\r\n\r\n".encode()
        + BODY
    )
    await writer.drain()
    await stop.wait()
    writer.close()


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--waiters", type=int, default=10000)
    ap.add_argument("--idle", action="store_true", help="connect without sending (baseline per connection)")
    ap.add_argument("--settle", type=float, default=0.0, help="seconds to wait with everyone parked before reading RSS")
    args = ap.parse_args()
    global IDLE
    rel = f"{ROOT}/target/release"
    procs = []
    try:
        pre, pre_addr = start([f"{rel}/pdrouter-mock", "--port", "0", "--role", "prefill", "--delay-ms", "600000"])
        dec, dec_addr = start([f"{rel}/pdrouter-mock", "--port", "0", "--role", "decode"])
        procs += [pre, dec]
        router, addr = start([
            f"{rel}/pdrouter", "launch", "--pd-disaggregation",
            "--prefill", f"http://{pre_addr}", "--decode", f"http://{dec_addr}",
            "--host", "127.0.0.1", "--port", "0", "--prometheus-host", "127.0.0.1", "--prometheus-port", "0",
            "--disable-health-check", "--prefill-max-inflight-requests-per-worker", "1",
            "--prefill-queue-size", str(args.waiters + 10), "--prefill-queue-timeout-secs", "600",
        ], env=dict(os.environ))
        procs.append(router)
        metrics_line = router.stdout.readline()
        maddr = re.search(r"http://([0-9.]+:[0-9]+)", metrics_line).group(1)
        stop = asyncio.Event()
        # Warm up: one request holds the only slot for the rest of the run.
        holder = asyncio.create_task(client(addr, stop))
        while metric(maddr, "smg_pd_prefill_admission_inflight") < 1:
            await asyncio.sleep(0.05)
        base = rss_kb(router.pid)
        t0 = time.time()
        IDLE = args.idle
        tasks = []
        for i in range(args.waiters):
            tasks.append(asyncio.create_task(client(addr, stop)))
            if i % 500 == 499:
                await asyncio.sleep(0.01)
        while not IDLE and metric(maddr, "smg_pd_prefill_admission_queued") < args.waiters:
            await asyncio.sleep(0.1)
            if time.time() - t0 > 120:
                raise SystemExit("waiters did not all queue within 120 s")
        if IDLE:
            await asyncio.sleep(3)
        parked_now = rss_kb(router.pid)
        await asyncio.sleep(args.settle)
        parked = rss_kb(router.pid)
        queued = metric(maddr, "smg_pd_prefill_admission_queued")
        stop.set()
        await asyncio.gather(*tasks, holder, return_exceptions=True)
        t1 = time.time()
        while metric(maddr, "smg_pd_prefill_admission_queued") > 0 and time.time() - t1 < 60:
            await asyncio.sleep(0.1)
        # Allocators return freed pages lazily (jemalloc purges after its decay time).
        await asyncio.sleep(12.0)
        after = rss_kb(router.pid)
        per = (parked - base) / args.waiters
        print(f"{'state':<22}{'router RSS (KB)':>18}")
        print(f"{'before':<22}{base:>18}")
        if args.settle:
            print(f"{'%d parked' % int(queued):<22}{parked_now:>18}")
            print(f"{'  … after %.0f s' % args.settle:<22}{parked:>18}")
        else:
            print(f"{'%d parked' % int(queued):<22}{parked:>18}")
        print(f"{'after drain':<22}{after:>18}")
        print(f"per waiter: {per:.2f} KB; kept after drain: {after - base} KB")
        print(f"waiters={int(queued)} rss_per_waiter_kb={per:.2f} rss_base_kb={base} rss_parked_kb={parked} rss_after_kb={after}")
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=5)
            except Exception:
                p.kill()


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
