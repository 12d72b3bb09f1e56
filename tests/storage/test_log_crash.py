"""Crash test with real processes: SIGKILL a writer that acks only fsynced records.

The writer derives every record (body and timestamp) from its offset, so after each kill the
reader can check that every acknowledged offset is present with exact bytes, and that every
record readable beyond it is also exact (nothing half-written survives recovery).
"""

import os
import random
import select
import signal
import struct
import subprocess
import sys
import textwrap
import time

import pytest

from nsqx.storage.log import LogConfig, PartitionLog
from nsqx.storage.message_id import make_id

WRITER = textwrap.dedent("""
    import asyncio, random, sys
    from nsqx.storage.commit import GroupCommitter
    from nsqx.storage.log import LogConfig, PartitionLog

    def body(o):
        n = 200_000 if o % 97 == 0 else (o * 7919) % 3000
        return (b"%d;" % o * (n // 4 + 1))[:n]

    async def producer(lg, gc, rnd):
        while True:
            n = rnd.choice([1, 1, 2, 5, 30])
            base = lg.next_offset
            fut = gc.append([body(base + j) for j in range(n)], base * 1000)
            got = await fut
            assert got == base
            sys.stdout.write(f"{base} {n}\\n")
            sys.stdout.flush()

    async def main():
        lg = PartitionLog(sys.argv[1], 3, LogConfig(segment_bytes=1024 * 1024, sync_every=1,
                                                    index_interval_bytes=1024))
        gc = GroupCommitter(lg)
        sys.stdout.write(f"ready {lg.next_offset}\\n")
        sys.stdout.flush()
        rnd = random.Random(int(sys.argv[2]))
        await asyncio.gather(*(producer(lg, gc, rnd) for _ in range(4)))

    asyncio.run(main())
""")


def body(o: int) -> bytes:
    n = 200_000 if o % 97 == 0 else (o * 7919) % 3000
    return (b"%d;" % o * (n // 4 + 1))[:n]


def check_frame(lg: PartitionLog, o: int) -> None:
    f = lg.read_frame(o)
    b = body(o)
    assert f[:8] == struct.pack(">II", 30 + len(b), 2)
    ts = struct.unpack_from(">q", f, 8)[0]
    assert ts % 1000 == 0 and ts // 1000 <= o  # base*1000 of its batch
    assert f[16:18] == b"\0\1" and f[18:34] == make_id(3, o) and f[34:] == b


# Segments of 1 MiB: many rolls per run, but not thousands of segments (each keeps six
# files open, and reader and writer share the machine's open-file limit).


def run_cycles(tmp_path, cycles: int, seed: int) -> None:
    rnd = random.Random(seed)
    path = tmp_path / "log"
    acked_end = 0
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    for cycle in range(cycles):
        proc = subprocess.Popen([sys.executable, "-c", WRITER, str(path), str(seed + cycle)],
                                stdout=subprocess.PIPE, env=env)
        try:
            line = proc.stdout.readline().split()
            assert line and line[0] == b"ready", line
            assert int(line[1]) >= acked_end  # every acked record survived the last kill
            deadline = time.monotonic() + rnd.uniform(0.05, 0.6)
            buf = b""
            fd = proc.stdout.fileno()
            while time.monotonic() < deadline:
                r, _, _ = select.select([fd], [], [], 0.01)
                if r:
                    buf += os.read(fd, 65536)
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
            buf += proc.stdout.read()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            proc.stdout.close()
        for ln in buf.split(b"\n"):
            parts = ln.split()
            if len(parts) == 2:  # a complete ack line
                acked_end = max(acked_end, int(parts[0]) + int(parts[1]))
        lg = PartitionLog(path, 3, LogConfig(segment_bytes=1024 * 1024, index_interval_bytes=1024))
        try:
            assert lg.next_offset >= acked_end, f"cycle {cycle}: lost acknowledged records"
            # every readable record is exact, acked or not; a sample plus the tail
            end = lg.next_offset
            sample = set(rnd.sample(range(end), min(end, 200))) | set(range(max(0, end - 60), end))
            for o in sorted(sample):
                check_frame(lg, o)
            data = bytes(lg.read(max(0, end - 60), 1 << 30).data)
            assert len(data) == sum(34 + len(body(o)) for o in range(max(0, end - 60), end))
        finally:
            lg.close()
    assert acked_end > 0


def test_crash_sigkill_few_cycles(tmp_path):
    run_cycles(tmp_path, 5, 1234)


@pytest.mark.slow
def test_crash_sigkill_many_cycles(tmp_path):
    run_cycles(tmp_path, 30, 99)
