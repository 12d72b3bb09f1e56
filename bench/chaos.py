"""Run the cluster chaos scenarios for longer than CI does.

    .venv/bin/python bench/chaos.py --minutes 30 [--only kill|stop|cut]

CI runs each chaos scenario (tests/cluster/test_chaos.py: kill -9 and SIGSTOP of the
leader under stock pynsq producers and consumers; tests/cluster/test_network_cut.py: the
leader cut from its followers and etcd) for 2 fault cycles. This runs the same tests,
with their total-queue checkers (0 acknowledged messages lost, duplicates bounded), with
as many cycles as fit in the given minutes (a cycle takes ~12 s), and prints pytest's
output with each cycle's failover time.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CYCLE_S = 12  # one fault, failover, restart and rejoin
SCENARIOS = {
    "kill": "tests/cluster/test_chaos.py::test_no_acknowledged_message_is_lost[kill-any]",
    "stop": "tests/cluster/test_chaos.py::test_no_acknowledged_message_is_lost[stop-leader]",
    "cut": "tests/cluster/test_network_cut.py",
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=10.0, help="total time (default 10)")
    ap.add_argument("--only", choices=sorted(SCENARIOS), action="append",
                    help="run only this scenario (repeatable; default all three)")
    args = ap.parse_args()
    chosen = args.only or sorted(SCENARIOS)
    cycles = max(2, int(args.minutes * 60 / len(chosen) / CYCLE_S))
    print(f"{len(chosen)} scenario(s) x {cycles} fault cycles (~{args.minutes:g} min)",
          flush=True)
    env = dict(os.environ, NSQX_CHAOS_CYCLES=str(cycles),
               PYTHONPATH=str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [sys.executable, "-m", "pytest", "-s", "-q", "-p", "no:cacheprovider",
           *(SCENARIOS[n] for n in chosen)]
    return subprocess.call(cmd, cwd=ROOT, env=env)


if __name__ == "__main__":
    sys.exit(main())
