"""What one PUB costs the server, interpreted vs compiled: instructions, not seconds.

    .venv/bin/python bench/compile_spike.py [--pubs 4000] [--conns 16] [--callgrind]

Starts nsqd (the one on PATH of this interpreter's venv, i.e. whatever build of nsqx
is installed: interpreted, Cython-compiled or mypyc-compiled modules), sends PUBs one
at a time from ``--conns`` connections (each waits for its OK before the next), and
prints the server's CPU per PUB from /proc. With ``--callgrind`` the server runs under
``valgrind --tool=callgrind`` and the script prints the instructions the server
executed per PUB during the load alone (``callgrind_control --dump`` before and after
it): a count that does not change with what else the machine is doing, which is why
the compile spike of issue 20 was decided with it on a shared 2-core machine.
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from nsqx.benchmark import loadgen  # noqa: E402
from nsqx.protocol import v2  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ping(http_port: int, timeout: float) -> None:
    import http.client
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            c = http.client.HTTPConnection("127.0.0.1", http_port, timeout=2)
            c.request("GET", "/ping")
            if c.getresponse().status == 200:
                return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError("nsqd did not answer /ping")


def publisher(addr: str, topic: str, n: int, errors: list[str]) -> None:
    try:
        s = loadgen._connect(addr)
        cmd = v2.pub(topic, loadgen.body_of(100))
        buf = bytearray()
        for _ in range(n):
            s.sendall(cmd)
            loadgen._read_frames_until(s, 1, buf)
        s.close()
    except Exception as e:  # noqa: BLE001 - reported below
        errors.append(repr(e))


def load(addr: str, pubs: int, conns: int) -> float:
    errors: list[str] = []
    per = pubs // conns
    threads = [threading.Thread(target=publisher, args=(addr, "spike", per, errors))
               for _ in range(conns)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise RuntimeError(f"publishers failed: {errors[:3]}")
    return time.perf_counter() - t0


def callgrind_total(path: str) -> int:
    with open(path) as f:
        for line in f:
            if line.startswith("totals:") or line.startswith("summary:"):
                return int(line.split()[1])
    raise RuntimeError(f"no totals in {path}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--pubs", type=int, default=4000)
    ap.add_argument("--conns", type=int, default=16)
    ap.add_argument("--callgrind", action="store_true")
    ap.add_argument("--label", default=os.environ.get("SPIKE_LABEL", "this build"))
    args = ap.parse_args()

    nsqd = str(Path(sys.executable).with_name("nsqd"))
    data = tempfile.mkdtemp(prefix="spike-")
    tcp, http = free_port(), free_port()
    cmd = [nsqd, f"--data-path={data}", f"--tcp-address=127.0.0.1:{tcp}",
           f"--http-address=127.0.0.1:{http}", "--log-level=warn"]
    if args.callgrind:
        cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={data}/cg.out.%p",
               "--dump-instr=no", "--collect-jumps=no", *cmd]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_ping(http, 300 if args.callgrind else 20)
        addr = f"127.0.0.1:{tcp}"
        load(addr, min(args.pubs, 200), 1)  # warm: topic created, code paths taken once
        if args.callgrind:
            subprocess.run(["callgrind_control", "--dump=before", str(proc.pid)],
                           check=True, stdout=subprocess.DEVNULL)
        before = loadgen.proc_stats(proc.pid)["cpu_s"]
        secs = load(addr, args.pubs, args.conns)
        cpu = loadgen.proc_stats(proc.pid)["cpu_s"] - before
        instr = None
        if args.callgrind:
            subprocess.run(["callgrind_control", "--dump=after", str(proc.pid)],
                           check=True, stdout=subprocess.DEVNULL)
            dumps = sorted(glob.glob(f"{data}/cg.out.*.2"))
            instr = callgrind_total(dumps[-1]) / args.pubs
        line = (f"{args.label}: {args.pubs} PUBs over {args.conns} conns, "
                f"{args.pubs / secs:,.0f} msgs/s, server CPU {cpu / args.pubs * 1e6:.1f} us/PUB")
        if instr is not None:
            line += f", {instr:,.0f} instructions/PUB (callgrind)"
        print(line, flush=True)
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    main()
