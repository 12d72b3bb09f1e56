"""What draining one message costs nsqd: instructions (callgrind) and CPU, for any source tree.

    .venv/bin/python bench/drain_instructions.py [--tree DIR] [--messages 50000]
        [--size 200] [--rdy 2500] [--mode callgrind|plain|both] [--label NAME]

The scenario of Go's ``bench_reader`` after ``bench_writer``: a topic is pre-filled with
``--messages`` bodies of ``--size`` bytes over MPUB (not measured), then one raw consumer
(``nsqx.benchmark.loadgen.run_reader``: SUB, RDY 2500, a whole read's FINs in one send)
drains them. Only the drain is measured: ``callgrind_control --dump`` before the consumer
connects and after nsqd reports the channel empty with nothing in flight; the second
dump's total divided by the messages is the instructions per message, a count that does
not move with what else a shared machine runs (wall-clock rates there are noise). The
one-off connect/SUB and the /stats polls that see the end fall inside the window: a few
million instructions, well under 1% of the drain.

``--tree`` is the source tree whose nsqd runs (PYTHONPATH=<tree>/src with this
interpreter, so a ``git worktree add /tmp/bisect-<sha> <sha>`` of an older commit runs
as it was); the load generator is always this checkout's. A tree with ``_speedups.c``
gets its C extension built in place first, as ``pip install -e .`` would. ``plain``
mode runs nsqd without valgrind and prints its /proc user+sys CPU per message (noisy on a
busy machine); ``callgrind`` prints both (its CPU is valgrind's, ~50x).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(HERE / "src"))
sys.path.insert(0, str(HERE / "bench"))

from compile_spike import callgrind_total, wait_ping  # noqa: E402
from nsqx.benchmark import loadgen  # noqa: E402
from nsqx.protocol import v2  # noqa: E402

TOPIC, CHANNEL = "drain", "ch"
_START = "import sys; from nsqx.cli.nsqd import main; main()"


def free_ports(n: int) -> list[int]:
    """n distinct free ports (all bound at once, so never the same one twice)."""
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def build_speedups(tree: Path) -> None:
    """Build the tree's optional C extension in place if it has one and it is not built
    (with the flags of its setup.py; setuptools is not asked, the venv's may be too old
    for the tree's pyproject)."""
    src = tree / "src/nsqx/_speedups.c"
    out = src.with_name("_speedups" + sysconfig.get_config_var("EXT_SUFFIX"))
    if not src.exists() or out.exists():
        return
    subprocess.run([os.environ.get("CC", "cc"), "-O2", "-shared", "-fPIC",
                    f"-I{sysconfig.get_paths()['include']}", str(src), "-o", str(out)],
                   check=True)


def tree_env(tree: Path) -> dict[str, str]:
    """An environment whose ``import nsqx`` is the tree's, checked (an editable install
    of another checkout must not win)."""
    env = dict(os.environ, PYTHONPATH=str(tree / "src"))
    env.pop("NSQX_NO_SPEEDUPS", None)
    got = subprocess.run([sys.executable, "-c", "import nsqx; print(nsqx.__file__)"], env=env,
                         check=True, capture_output=True, text=True).stdout.strip()
    if not Path(got).resolve().is_relative_to((tree / "src").resolve()):
        raise SystemExit(f"nsqx comes from {got}, not from {tree}/src")
    return env


def prefill(addr: str, messages: int, size: int, batch: int = 1000) -> None:
    """MPUB ``messages`` bodies in batches, each answered before the next."""
    for _ in range(600):  # some versions answer /ping before the TCP listener opens
        try:
            s = loadgen._connect(addr)
            break
        except ConnectionRefusedError:
            time.sleep(0.5)
    buf = bytearray()
    left = messages
    while left:
        n = min(batch, left)
        s.sendall(v2.mpub(TOPIC, [loadgen.body_of(size, i) for i in range(n)]))
        loadgen._read_frames_until(s, 1, buf)
        left -= n
    s.close()


def channel_stats(http_port: int) -> dict:
    with urllib.request.urlopen(
            f"http://127.0.0.1:{http_port}/stats?format=json&topic={TOPIC}", timeout=60) as r:
        data = json.load(r)
    data = data.get("data", data)  # older answers wrap it in {"data": ...}
    for t in data["topics"]:
        if t["topic_name"] == TOPIC:
            for c in t["channels"]:
                if c["channel_name"] == CHANNEL:
                    return c
    raise RuntimeError("channel not in /stats")


def wait_drained(http_port: int, timeout: float) -> int:
    """Wait until nsqd has taken every FIN (depth 0, nothing in flight); returns the polls."""
    deadline = time.monotonic() + timeout
    polls = 0
    while True:
        polls += 1
        c = channel_stats(http_port)
        if c["depth"] == 0 and c["in_flight_count"] == 0:
            return polls
        if time.monotonic() > deadline:
            raise RuntimeError(f"channel not drained: {c}")
        time.sleep(0.2)


def run_once(tree: Path, env: dict[str, str], args: argparse.Namespace, grind: bool) -> str:
    data = tempfile.mkdtemp(prefix="drain-")
    tcp, http = free_ports(2)
    cmd = [sys.executable, "-c", _START, f"--data-path={data}",
           f"--tcp-address=127.0.0.1:{tcp}", f"--http-address=127.0.0.1:{http}",
           "--log-level=warn"]
    if grind:
        cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={data}/cg.out.%p",
               "--dump-instr=no", "--collect-jumps=no", "--compress-strings=no",
               "--compress-pos=no", *cmd]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    slow = 50 if grind else 1
    idle = None
    try:
        wait_ping(http, 20 * slow)
        if proc.poll() is not None:
            raise RuntimeError("nsqd exited (a port taken by another process?)")
        addr = f"127.0.0.1:{tcp}"
        if args.sub_first:  # a consumer with RDY 0 on the channel while it fills
            idle = loadgen._connect(addr)
            idle.sendall(v2.sub(TOPIC, CHANNEL))
            loadgen._read_frames_until(idle, 1, bytearray())
            time.sleep(2)  # past the node's delayed re-split of the memory budget
        prefill(addr, args.messages, args.size)
        # /stats answers once the HTTP API is loaded (newer nsqd imports aiohttp in a
        # thread after start): that import and the first /stats stay out of the window
        urllib.request.urlopen(f"http://127.0.0.1:{http}/stats?format=json",
                               timeout=60 * slow).read()
        if grind:
            subprocess.run(["callgrind_control", "--dump=before", str(proc.pid)],
                           check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        cpu0 = loadgen.proc_stats(proc.pid)["cpu_s"]
        t0 = time.perf_counter()
        res = loadgen.run_reader(addr, TOPIC, CHANNEL, args.messages, 10.0 * slow,
                                 rdy=args.rdy)
        polls = wait_drained(http, 10.0 * slow)
        secs = time.perf_counter() - t0
        cpu = loadgen.proc_stats(proc.pid)["cpu_s"] - cpu0
        if res.errors or res.messages != args.messages:
            raise RuntimeError(f"reader got {res.messages}/{args.messages}: {res.errors[:3]}")
        line = (f"{args.label} [{'callgrind' if grind else 'plain'}]: {res.messages} x "
                f"{args.size} B drained, RDY {args.rdy}, {res.messages / secs:,.0f} msgs/s, "
                f"nsqd CPU {cpu / res.messages * 1e6:.2f} us/msg")
        if grind:
            subprocess.run(["callgrind_control", "--dump=after", str(proc.pid)],
                           check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            dumps = sorted(glob.glob(f"{data}/cg.out.*.2"))
            instr = callgrind_total(dumps[-1]) / res.messages
            if args.keep:
                shutil.copy(dumps[-1], args.keep)
            line += f", {instr:,.0f} instructions/msg (callgrind, {polls} /stats polls)"
        return line
    finally:
        if idle is not None:
            idle.close()
        proc.terminate()
        try:
            proc.wait(30 * slow)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.returncode not in (0, -15):
            sys.stderr.write(proc.stderr.read().decode(errors="replace")[-2000:])
        shutil.rmtree(data, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--tree", type=Path, default=HERE, help="source tree whose nsqd runs")
    ap.add_argument("--messages", type=int, default=50_000)
    ap.add_argument("--size", type=int, default=200)
    ap.add_argument("--rdy", type=int, default=2500)
    ap.add_argument("--mode", choices=("callgrind", "plain", "both"), default="both")
    ap.add_argument("--label", default=None)
    ap.add_argument("--sub-first", action="store_true",
                    help="subscribe an idle consumer (RDY 0) before the topic is filled")
    ap.add_argument("--keep", type=Path, help="copy the drain's callgrind dump here "
                    "(for callgrind_annotate)")
    args = ap.parse_args()
    tree = args.tree.resolve()
    if args.label is None:
        args.label = subprocess.run(["git", "-C", str(tree), "log", "-1", "--format=%h %cs"],
                                    capture_output=True, text=True).stdout.strip() or str(tree)
    build_speedups(tree)
    env = tree_env(tree)
    modes = {"callgrind": [True], "plain": [False], "both": [False, True]}[args.mode]
    for grind in modes:
        print(run_once(tree, env, args, grind), flush=True)


if __name__ == "__main__":
    main()
