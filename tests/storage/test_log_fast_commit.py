"""The one-batch fast commit (Segment.write_single) writes what the general commit writes."""

import shutil
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nsqx.storage.log import LogConfig, PartitionLog

BODY = st.one_of(st.binary(max_size=3), st.binary(min_size=50, max_size=400))
BATCH = st.tuples(
    st.one_of(st.lists(BODY, min_size=1, max_size=30),  # mixed sizes
              st.tuples(BODY, st.integers(1, 30)).map(lambda t: [t[0]] * t[1])),  # uniform
    st.integers(0, 2),  # epoch
    st.booleans(),  # with headers (always the general path)
    st.integers(1, 3),  # batches per flush (one = fast path)
)


def files(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir()) if p.name != "recovery-point"}


def write(d: Path, batches, fast: bool) -> list:
    cfg = LogConfig(segment_bytes=3000, index_interval_bytes=300, mem_tail_bytes=1500)
    saved = PartitionLog._fast_commit
    PartitionLog._fast_commit = fast
    try:
        lg = PartitionLog(d, 3, cfg)
        ts = 1_000
        for bodies, epoch, with_headers, per_flush in batches:
            for _ in range(per_flush):
                ts += 7
                hdrs = [{"k": b"v"}] * len(bodies) if with_headers else None
                lg.append(bodies, ts, epoch=epoch, headers=hdrs)
            lg.flush()
        reads = [lg.read_frame(o) for o in range(lg.start_offset, lg.next_offset)]
        tail = [tuple(b) for b in lg.batches(0)]
        lg.close()
        lg = PartitionLog(d, 3, cfg)  # recovery reads the same metadata back
        assert [lg.read_frame(o) for o in range(lg.start_offset, lg.next_offset)] == reads
        lg.close()
        return [reads, tail]
    finally:
        PartitionLog._fast_commit = saved


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(BATCH, min_size=1, max_size=25))
def test_fast_commit_writes_the_same_files(batches):
    root = Path(tempfile.mkdtemp(prefix="fastcommit-"))
    try:
        fast = write(root / "fast", batches, True)
        general = write(root / "general", batches, False)
        assert fast == general
        assert files(root / "fast") == files(root / "general")
    finally:
        shutil.rmtree(root)
