"""Per-message costs of ``nsqd --workers`` and a scaling model for 8, 16 and 32 cores.

    .venv/bin/python bench/workers_model.py [--runs 5] [--seconds 3] [--conns 16] [--subs 3000]

Measured here, with ``--workers=1`` and ``--workers=2`` alternating (a fresh node per run),
``--runs`` times; medians. CPU is utime + stime from /proc of the server's processes (the
supervisor and every worker, or the one process), over each scenario's timed window:

* ``pub``: PUB one at a time (one in flight per connection), ``--conns`` connections over
  two topics, one owned by each worker (``ownership.owner_of``), each connection
  publishing to one of them. A connection moves to the owner of the topic it first
  publishes to, so every publish is done by its owner: the **owner** cost.
* ``pub_fwd``: the same connections first publish once to their "home" topic (which moves
  them to its owner), then only to the other worker's topic: with 2 workers every timed
  publish is **forwarded** (parsed and answered on one worker, stored on the other). Its
  CPU per message minus ``pub``'s is the forward cost. With 1 worker it is ``pub`` again.
  Checked per run: the workers' internal sockets (``w<K>.tcp``) carry no connection after
  ``pub`` (nothing forwarded) and some after ``pub_fwd`` (printed: forwarding sockets).
* ``mpub`` / ``mpub_fwd``: the same with MPUBs of ``--batch`` bodies, ``--window`` in
  flight, on 4 connections.
* ``drain``: two topics (one per worker) with a channel filled for ``--fill-seconds`` by
  MPUB, then drained by one consumer each (``loadgen.run_reader``: RDY 2500, FINs of a
  read in one write): the **delivery** cost per message, on the owner (a SUB moves the
  connection to the owner too, so nothing is relayed).
* ``subscribe``: ``--subs`` connections each IDENTIFY and SUB (a topic of worker 1),
  100 at a time, kept open: connections/s and CPU per connection. With 2 workers the
  ones the kernel gave worker 0 are handed over (SCM_RIGHTS); the extra CPU per
  **handover** is (CPU with 2 workers - with 1) / handovers (counted in the node's log).

Beside each, the load generators' own CPU per message (``time.process_time`` of their
processes; raw-socket loops, one epoll loop per process over its connections).

The model (printed, with its assumptions): C cores, N = C workers, connections and topics
spread evenly, so f = (N-1)/N of the publishes land on a worker that does not own the topic.
One PUB at a time then costs owner + f * forward of server CPU, and C cores publish
C / (owner + f * forward) per second. Go nsqd 1.3.0 measured 9.7 us of server CPU per PUB
(issue 32, 2026-11-28, not this run: Go is not installed here), taken to scale linearly:
C / 9.7 us. Go's 9.7 us was measured on an idle machine; this machine is shared, and CPU
per message grows with the load beside it, so the model is printed twice: with this run's
costs ("here"), and with them scaled by 13.7 us / this run's ``--workers=1`` owner cost
("idle-scaled": 13.7 us is nsqx's PUB cost in that same idle run as Go's 9.7 us), which
assumes the load inflates every cost by the same factor.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import queue
import select
import shutil
import socket
import statistics
import struct
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from nsqd_proc import SRC, cpu_seconds, start_workers, stop, tree

sys.path.insert(0, SRC)

from nsqx.benchmark import loadgen  # noqa: E402
from nsqx.nsqd.workers.ownership import owner_of  # noqa: E402
from nsqx.protocol import v2  # noqa: E402

GO_PUB_US = 9.7  # Go nsqd 1.3.0, server CPU per PUB one at a time, 16 conns (issue 32)
GO_PUB_RATE_2 = 97_000  # its msgs/s on this 2-core machine, generator beside it (issue 32)
ISSUE_PUB_US = 13.7  # nsqx (one process) in the same idle-machine run as GO_PUB_US
HANDOVER_LINE = b"handed over to worker"
_HDR = struct.Struct(">II")
CTX = mp.get_context("fork")


def topic_of(worker: int, prefix: str, workers: int = 2) -> str:
    """The first ``<prefix><i>`` that ``workers`` workers give to ``worker``."""
    i = 0
    while owner_of(f"{prefix}{i}", workers) != worker:
        i += 1
    return f"{prefix}{i}"


# -- load generators (child processes) ----------------------------------------------------
def publishers(addr: str, plan: list[tuple[str, str]], size: int, batch: int, window: int,
               seconds: float, go: Any, out: Any) -> None:
    """Each (first, topic) of ``plan`` is one connection: one PUB to ``first`` (untimed: it
    moves the connection to that topic's owner), then after ``go`` PUB (``batch`` 1) or
    MPUB to ``topic``, ``window`` in flight, for ``seconds``. Puts (messages per topic,
    end time, own CPU seconds)."""
    bodies = [loadgen.body_of(size, i) for i in range(batch)]
    socks: list[socket.socket] = []
    payloads: list[bytes] = []
    for first, topic in plan:
        s = loadgen._connect(addr)
        s.sendall(v2.pub(first, bodies[0]))
        loadgen._read_frames_until(s, 1, bytearray())
        s.settimeout(None)  # blocking: no poll() before each call; epoll says when to read
        socks.append(s)
        payloads.append(v2.pub(topic, bodies[0]) if batch == 1 else v2.mpub(topic, bodies))
    ep = select.epoll()
    index = {s.fileno(): i for i, s in enumerate(socks)}
    for s in socks:
        ep.register(s.fileno(), select.EPOLLIN)
    answered = [0] * len(socks)
    outstanding = [0] * len(socks)
    bufs = [bytearray() for _ in socks]
    ok = b"\x00\x00\x00\x06\x00\x00\x00\x00OK"
    go.wait()
    cpu0 = time.process_time()
    deadline = time.monotonic() + seconds
    for i, s in enumerate(socks):
        s.sendall(payloads[i] * window)
        outstanding[i] = window
    sending = True
    while sending or any(outstanding):
        if sending and time.monotonic() >= deadline:
            sending = False
        for fd, _ev in ep.poll(1.0):
            i = index[fd]
            data = socks[i].recv(1 << 16)
            if not data:
                raise ConnectionError("nsqd closed a publisher's connection")
            buf = bufs[i]
            buf += data
            n = buf.count(ok)
            if n * 10 == len(buf):  # the usual case: a run of OKs
                buf.clear()
            else:  # anything else: frame by frame (an error answers its command too)
                n = 0
                while len(buf) >= 8:
                    fsize, ftype = _HDR.unpack_from(buf)
                    if len(buf) < 4 + fsize:
                        break
                    body = bytes(buf[8:4 + fsize])
                    del buf[:4 + fsize]
                    if ftype == 0 and body == b"_heartbeat_":
                        socks[i].sendall(b"NOP\n")
                        continue
                    if ftype == 1:
                        raise RuntimeError(f"nsqd answered {body!r}")
                    n += 1
            outstanding[i] -= n
            answered[i] += n
            if sending and n:
                socks[i].sendall(payloads[i] * n)
                outstanding[i] += n
    end = time.monotonic()
    cpu = time.process_time() - cpu0
    per_topic: dict[str, int] = {}
    for (_first, topic), n in zip(plan, answered, strict=True):
        per_topic[topic] = per_topic.get(topic, 0) + n * batch
    out.put((per_topic, end, cpu))
    for s in socks:
        s.close()


def reader(addr: str, topic: str, expect: int, go: Any, out: Any) -> None:
    go.wait()
    cpu0 = time.process_time()
    res = loadgen.run_reader(addr, topic, "c", expect, 120.0)
    if res.messages < expect or res.errors:
        raise RuntimeError(f"drained {res.messages} of {expect}: {res.errors[:3]}")
    out.put(({topic: res.messages}, time.monotonic(), time.process_time() - cpu0))


def subscribers(addr: str, topic: str, count: int, go: Any, out: Any, done: Any) -> None:
    """``count`` connections IDENTIFY and SUB, 100 at a time; kept open until ``done``."""
    host, _, port = addr.rpartition(":")
    hello = v2.MAGIC_V2 + v2.identify({"feature_negotiation": False,
                                       "user_agent": "nsqx-bench"}) + v2.sub(topic, "c")
    go.wait()
    cpu0 = time.process_time()
    socks: list[socket.socket] = []
    while len(socks) < count:
        wave = [socket.create_connection((host, int(port)), timeout=30)
                for _ in range(min(100, count - len(socks)))]
        for s in wave:
            s.sendall(hello)
        for s in wave:
            loadgen._read_frames_until(s, 2, bytearray())  # IDENTIFY's OK, SUB's OK
        socks += wave
    out.put(({topic: count}, time.monotonic(), time.process_time() - cpu0))
    done.wait()
    for s in socks:
        s.close()


# -- one node, every scenario ---------------------------------------------------------------
def measure(pids: list[int], procs: list[Any], go: Any, out: Any,
            done: Any = None) -> dict[str, Any]:
    """Start ``procs`` (each waits for ``go``), time them: messages, msgs/s, server and
    generator CPU per message."""
    for p in procs:
        p.start()
    time.sleep(0.5)  # every generator connected and waiting
    cpu0 = sum(cpu_seconds(p) for p in pids)
    t0 = time.monotonic()
    go.set()
    results: list[Any] = []
    while len(results) < len(procs):  # a generator that died is an error, not a hang
        try:
            results.append(out.get(timeout=1))
        except queue.Empty:
            dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
            if dead or time.monotonic() - t0 > 300:
                for p in procs:
                    p.kill()
                raise RuntimeError(f"a load generator failed (exit {dead})") from None
    cpu1 = sum(cpu_seconds(p) for p in pids)
    if done is not None:
        done.set()
    for p in procs:
        p.join(60)
        if p.exitcode != 0:
            raise RuntimeError(f"a load generator failed (exit {p.exitcode})")
    per_topic: dict[str, int] = {}
    for counts, _end, _cpu in results:
        for t, n in counts.items():
            per_topic[t] = per_topic.get(t, 0) + n
    msgs = sum(per_topic.values())
    wall = max(r[1] for r in results) - t0
    return {"messages": msgs, "per_topic": per_topic, "rate": msgs / wall,
            "server_us": (cpu1 - cpu0) / msgs * 1e6,
            "gen_us": sum(r[2] for r in results) / msgs * 1e6}


def run_publishers(addr: str, pids: list[int], plan: list[tuple[str, str]], procs: int,
                   args: argparse.Namespace, batch: int, window: int,
                   seconds: float) -> dict[str, Any]:
    go, out = CTX.Event(), CTX.Queue()
    shares = [plan[k::procs] for k in range(procs) if plan[k::procs]]
    size = args.size
    return measure(pids, [CTX.Process(target=publishers, args=(
        addr, share, size, batch, window, seconds, go, out)) for share in shares], go, out)


def forward_links(data: Path) -> int:
    """Connected sockets on the workers' internal TCP sockets (``w<K>.tcp``, /proc/net/unix):
    an owner link opens at a worker's first forward and stays, so 0 means none yet."""
    where = f"{data.resolve()}/.workers/w"
    n = 0
    for line in Path("/proc/net/unix").read_text().splitlines()[1:]:
        f = line.split()
        if len(f) >= 8 and f[5] == "03" and f[7].startswith(where) and f[7].endswith(".tcp"):
            n += 1
    return n


def post(http: str, path: str) -> None:
    urllib.request.urlopen(urllib.request.Request(f"http://{http}{path}", data=b""),
                           timeout=10).read()


def one_node(tmp: Path, workers: int, args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    data = tmp / f"data-{workers}"
    shutil.rmtree(data, ignore_errors=True)
    data.mkdir(parents=True)
    log = tmp / f"nsqd-{workers}.log"
    proc, tcp, http = start_workers(data, workers)
    try:
        pids = tree(proc.pid)
        # the topics of worker 0 and of worker 1 (with 2 workers; one process owns both)
        p = [topic_of(k, "p") for k in (0, 1)]
        m = [topic_of(k, "m") for k in (0, 1)]
        d = [topic_of(k, "d") for k in (0, 1)]
        for t in p + m + d:
            post(http, f"/topic/create?topic={t}")
        for t in d:
            post(http, f"/channel/create?topic={t}&channel=c")
        s_topic = topic_of(1, "s")
        post(http, f"/topic/create?topic={s_topic}")
        post(http, f"/channel/create?topic={s_topic}&channel=c")
        res: dict[str, dict[str, Any]] = {}
        # half the connections' home is worker 0's topic, half worker 1's
        home = [k % 2 for k in range(args.conns)]
        res["pub"] = run_publishers(tcp, pids, [(p[h], p[h]) for h in home], args.gen_procs,
                                    args, 1, 1, args.seconds)
        res["pub"]["links"] = forward_links(data)  # 0: nothing was forwarded
        time.sleep(0.3)
        res["pub_fwd"] = run_publishers(tcp, pids, [(p[h], p[1 - h]) for h in home],
                                        args.gen_procs, args, 1, 1, args.seconds)
        res["pub_fwd"]["links"] = forward_links(data)  # with 2 workers: > 0, forwarded
        time.sleep(0.3)
        mh = [0, 1, 0, 1]
        res["mpub"] = run_publishers(tcp, pids, [(m[h], m[h]) for h in mh], 2, args,
                                     args.batch, args.window, args.seconds / 2)
        time.sleep(0.3)
        res["mpub_fwd"] = run_publishers(tcp, pids, [(m[h], m[1 - h]) for h in mh], 2, args,
                                         args.batch, args.window, args.seconds / 2)
        time.sleep(0.3)
        fill = run_publishers(tcp, pids, [(d[h], d[h]) for h in mh], 2, args,
                              args.batch, args.window, args.fill_seconds)
        time.sleep(0.3)
        go, out = CTX.Event(), CTX.Queue()
        res["drain"] = measure(pids, [CTX.Process(target=reader, args=(
            tcp, t, fill["per_topic"][t], go, out)) for t in d], go, out)
        time.sleep(0.3)
        go, out, done = CTX.Event(), CTX.Queue(), CTX.Event()
        handovers0 = log.read_bytes().count(HANDOVER_LINE)
        res["subscribe"] = measure(pids, [CTX.Process(target=subscribers, args=(
            tcp, s_topic, args.subs, go, out, done))], go, out, done)
        res["subscribe"]["handovers"] = log.read_bytes().count(HANDOVER_LINE) - handovers0
        return res
    finally:
        stop(proc)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=3.0,
                    help="each PUB scenario (MPUB: half of it)")
    ap.add_argument("--conns", type=int, default=16, help="PUB one at a time connections")
    ap.add_argument("--gen-procs", type=int, default=2,
                    help="load generator processes for the PUB connections")
    ap.add_argument("--size", type=int, default=200, help="body bytes")
    ap.add_argument("--batch", type=int, default=100, help="MPUB bodies")
    ap.add_argument("--window", type=int, default=4, help="MPUBs in flight per connection")
    ap.add_argument("--fill-seconds", type=float, default=1.0)
    ap.add_argument("--subs", type=int, default=3000, help="subscribing connections")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="nsqx-bench-wmodel-"))
    res: dict[int, list[dict[str, dict[str, Any]]]] = {1: [], 2: []}
    started = time.monotonic()
    print(f"# {time.strftime('%Y-%m-%d %H:%M')} {os.cpu_count()} cores, load average "
          f"{os.getloadavg()[0]:.1f}; PUB {args.size} B, {args.conns} connections, "
          f"{args.seconds:g} s; MPUB {args.batch} x {args.size} B, {args.window} in flight, "
          f"4 connections, {args.seconds / 2:g} s; {args.subs} subscribers", flush=True)
    try:
        for run in range(args.runs):
            for w in (1, 2):
                r = one_node(tmp, w, args)
                res[w].append(r)
                for name, x in r.items():
                    extra = (f", {x['handovers']} handovers" if "handovers" in x else
                             f", {x['links']} forwarding sockets" if "links" in x else "")
                    unit = "conn" if name == "subscribe" else "msg"
                    print(f"run {run + 1} --workers={w} {name:9s} {x['rate']:>10,.0f} "
                          f"{unit}s/s  server {x['server_us']:6.2f} us/{unit}  generator "
                          f"{x['gen_us']:6.2f} us/{unit}{extra}", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    def med(w: int, name: str, key: str) -> float:
        return statistics.median(r[name][key] for r in res[w])

    def spread(w: int, name: str, key: str) -> str:
        xs = sorted(r[name][key] for r in res[w])
        return f"{xs[0]:.2f}-{xs[-1]:.2f}" if key != "rate" else f"{xs[0]:,.0f}-{xs[-1]:,.0f}"

    names = ["pub", "pub_fwd", "mpub", "mpub_fwd", "drain", "subscribe"]
    print(f"\nmedians of {args.runs} (min-max)")
    print("| scenario | workers | rate/s | server us | generator us |")
    print("|---|---|---|---|---|")
    for name in names:
        for w in (1, 2):
            print(f"| {name} | {w} | {med(w, name, 'rate'):,.0f} ({spread(w, name, 'rate')}) "
                  f"| {med(w, name, 'server_us'):.2f} ({spread(w, name, 'server_us')}) "
                  f"| {med(w, name, 'gen_us'):.2f} ({spread(w, name, 'gen_us')}) |")
    owner1 = med(1, "pub", "server_us")
    owner = med(2, "pub", "server_us")
    fwd_runs = [r["pub_fwd"]["server_us"] - r["pub"]["server_us"] for r in res[2]]
    forward = statistics.median(fwd_runs)
    mowner = med(2, "mpub", "server_us")
    mforward = statistics.median(r["mpub_fwd"]["server_us"] - r["mpub"]["server_us"]
                                 for r in res[2])
    delivery = med(2, "drain", "server_us")
    gen = med(2, "pub", "gen_us")
    hand_runs = [(r2["subscribe"]["server_us"] - r1["subscribe"]["server_us"])
                 * r2["subscribe"]["messages"] / max(r2["subscribe"]["handovers"], 1)
                 for r1, r2 in zip(res[1], res[2], strict=True)]
    print("\nper-message costs (server CPU, medians; forward and handover per run, "
          "paired with the same run's baseline)")
    print(f"  owner, PUB one at a time:     {owner:.2f} us (--workers=1: {owner1:.2f} us)")
    print(f"  forward, PUB one at a time:  +{forward:.2f} us (runs: "
          f"{', '.join(f'{x:+.2f}' for x in fwd_runs)})")
    print(f"  owner, MPUB:                  {mowner:.2f} us/msg "
          f"(--workers=1: {med(1, 'mpub', 'server_us'):.2f})")
    print(f"  forward, MPUB:               +{mforward:.2f} us/msg")
    print(f"  delivery (drain, RDY 2500):   {delivery:.2f} us/msg "
          f"(--workers=1: {med(1, 'drain', 'server_us'):.2f})")
    print(f"  generator, PUB one at a time: {gen:.2f} us/msg")
    print(f"  handover, extra per SUB handed over: {statistics.median(hand_runs):.1f} us "
          f"(runs: {', '.join(f'{x:.1f}' for x in hand_runs)}); subscribed connections/s "
          f"{med(1, 'subscribe', 'rate'):,.0f} (1 worker) vs "
          f"{med(2, 'subscribe', 'rate'):,.0f} (2)")

    scale = ISSUE_PUB_US / owner1
    print("\nmodel, PUB one at a time: C cores, N = C workers, f = (C-1)/C forwarded; "
          f"nsqx C / (owner + f x forward), Go C / {GO_PUB_US} us (linear).\n"
          f"  here: owner {owner:.2f}, forward {forward:.2f} us (this run's medians; 1 core: "
          f"--workers=1's {owner1:.2f});\n"
          f"  idle-scaled: the same x {scale:.3f} = {ISSUE_PUB_US} / {owner1:.2f} (issue 32's "
          f"idle-machine nsqx PUB cost over this run's --workers=1 owner cost): owner "
          f"{owner * scale:.2f}, forward {forward * scale:.2f} us")
    print("| cores | f | here: us/PUB | msgs/s | nsqx/Go | idle-scaled: us/PUB | msgs/s "
          "| nsqx/Go | Go msgs/s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for c in (1, 2, 8, 16, 32):
        f = (c - 1) / c
        per = owner1 if c == 1 else owner + f * forward  # 1 core: one process
        go_rate = c / GO_PUB_US * 1e6
        print(f"| {c} (model) | {f:.3f} | {per:.2f} | {c / per * 1e6:,.0f} | "
              f"{GO_PUB_US / per:.2f}x | {per * scale:.2f} | {c / per / scale * 1e6:,.0f} | "
              f"{GO_PUB_US / per / scale:.2f}x | {go_rate:,.0f} |")
    for w in (1, 2):
        rate = med(w, "pub", "rate")
        print(f"| --workers={w} measured on these 2 cores, generator beside it | | "
              f"{med(w, 'pub', 'server_us'):.2f} | {rate:,.0f} | {rate / GO_PUB_RATE_2:.2f}x "
              f"| | | | {GO_PUB_RATE_2:,} (issue 32, 2 cores, its generator beside it) |")
    for label, o, fw in (("here", owner, forward), ("idle-scaled", owner * scale,
                                                    forward * scale)):
        for c in (8, 16, 32):
            f = (c - 1) / c
            per = o + f * fw
            if per <= GO_PUB_US:
                print(f"  {label}, {c} cores: {per:.2f} us per PUB <= Go's {GO_PUB_US} us: "
                      "reaches 1.0x")
                continue
            k = per / GO_PUB_US
            how = (f"with the owner cost as is, forward <= {(GO_PUB_US - o) / f:.2f} us"
                   if o < GO_PUB_US else
                   f"the owner cost alone ({o:.2f} us) is above {GO_PUB_US} us: even free "
                   f"forwarding stays below 1.0x ({GO_PUB_US / o:.2f}x)")
            print(f"  {label}, {c} cores: {per:.2f} us per PUB vs Go's {GO_PUB_US} us: does "
                  f"not reach 1.0x ({GO_PUB_US / per:.2f}x); server CPU per PUB must fall "
                  f"{k:.2f}x (by {per - GO_PUB_US:.2f} us), e.g. owner <= {o / k:.2f} and "
                  f"forward <= {fw / k:.2f} us; {how}")
    for w, name in ((1, "pub"), (2, "pub"), (2, "pub_fwd")):
        cpu = med(w, name, "server_us") + med(w, name, "gen_us")
        print(f"  check, --workers={w} {name}: 2 cores / (server + generator CPU per msg) "
              f"= {2e6 / cpu:,.0f} msgs/s if nothing else ran; measured "
              f"{med(w, name, 'rate'):,.0f}")
    print(f"# {time.monotonic() - started:.0f} s, load average now "
          f"{os.getloadavg()[0]:.1f}", flush=True)


if __name__ == "__main__":
    main()
