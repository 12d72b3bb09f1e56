"""Run the cluster chaos scenarios for longer than CI does.

    .venv/bin/python bench/chaos.py --minutes 30 [--only kill|stop|cut|faults]
    .venv/bin/python bench/chaos.py --only faults --minutes 20 [--nemesis halves ...]

CI runs each chaos scenario (tests/cluster/test_chaos.py: kill -9 and SIGSTOP of the
leader under stock pynsq producers and consumers; tests/cluster/test_network_cut.py: the
leader cut from its followers and etcd) for 2 fault cycles. This runs the same tests,
with their total-queue checkers (0 acknowledged messages lost, duplicates bounded), with
as many cycles as fit in the given minutes (a cycle takes ~12 s), and prints pytest's
output with each cycle's failover time.

``faults`` is the namespace suite (tests/faults/test_nemeses.py, root only: every process on
its own network namespace, Jepsen's nemeses with nftables, SIGSTOP, kill -9 and wall-clock
shifts): the chosen
nemeses (default all) run in turn for as many rounds as fit, and it prints one row per
nemesis window: acked, lost, duplicates, longest time without an ack, recovered.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CYCLE_S = 12  # one fault, failover, restart and rejoin
NEMESIS_S = 15  # one nemesis window of the fault suite: 8 s held, then the ISR full again
ALL_NEMESES = 10  # tests/faults/nemesis.py NEMESES (the test refuses an unknown name)
SCENARIOS = {
    "kill": "tests/cluster/test_chaos.py::test_no_acknowledged_message_is_lost[kill-any]",
    "stop": "tests/cluster/test_chaos.py::test_no_acknowledged_message_is_lost[stop-leader]",
    "cut": "tests/cluster/test_network_cut.py",
    "faults": "tests/faults/test_nemeses.py",
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=10.0, help="total time (default 10)")
    ap.add_argument("--only", choices=sorted(SCENARIOS), action="append",
                    help="run only this scenario (repeatable; default all)")
    ap.add_argument("--nemesis", action="append", help="faults: run only this nemesis "
                    "(repeatable; default all: halves, isolate-leader, one-way, bridge, "
                    "etcd-minority, pause, kill, clock-skew, clock-jumps, clock-far)")
    args = ap.parse_args()
    chosen = args.only or sorted(SCENARIOS)
    nemeses = args.nemesis or []
    share = args.minutes * 60 / len(chosen)
    cycles = max(2, int(share / CYCLE_S))
    rounds = max(1, int(share / (NEMESIS_S * (len(nemeses) or ALL_NEMESES))))
    print(f"{len(chosen)} scenario(s) x {cycles} fault cycles, the fault suite {rounds} "
          f"round(s) of {','.join(nemeses) or 'every nemesis'} (~{args.minutes:g} min)", flush=True)
    env = dict(os.environ, NSQX_CHAOS_CYCLES=str(cycles), NSQX_FAULT_ROUNDS=str(rounds),
               **({"NSQX_FAULT_NEMESES": ",".join(nemeses)} if nemeses else {}),
               PYTHONPATH=str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [sys.executable, "-m", "pytest", "-s", "-q", "-p", "no:cacheprovider",
           *(SCENARIOS[n] for n in chosen)]
    return subprocess.call(cmd, cwd=ROOT, env=env)


if __name__ == "__main__":
    sys.exit(main())
