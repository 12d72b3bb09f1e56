"""Property test: random batches written, flushed, closed and reopened read back exactly."""

import os
import shutil
import struct
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nsqx.storage.log import LogConfig, MemoryLog, PartitionLog
from nsqx.storage.message_id import make_id

SIZES = st.one_of(st.integers(0, 3), st.integers(4, 300), st.just(4000))
BODY = st.tuples(SIZES, st.integers(0, 255)).map(lambda t: bytes([t[1]]) * t[0])
HDR = st.one_of(st.none(), st.dictionaries(st.sampled_from(["trace", "tag", "key", "ü"]),
                                           st.binary(max_size=20), min_size=1, max_size=3))
BIG = st.one_of(st.none(), st.none(), st.none(), st.just((b"\x5a" * (1 << 20), None)))
BATCH = st.tuples(
    st.tuples(st.lists(st.tuples(BODY, HDR), min_size=1, max_size=40), BIG).map(
        lambda t: t[0] + [t[1]] if t[1] else t[0]),
    st.integers(-5, 1000),  # timestamp step (sometimes backwards)
    st.booleans(),  # flush after
    st.integers(0, 3),  # epoch
)


def frame(body, off, ts, partition):
    return struct.pack(">IIqH", 30 + len(body), 2, ts, 1) + make_id(partition, off) + body


class Model:
    def __init__(self):
        self.frames, self.ts, self.headers = [], [], []

    def add(self, bodies, ts, hdrs, partition):
        for b, h in zip(bodies, hdrs, strict=True):
            self.frames.append(frame(b, len(self.frames), ts, partition))
            self.ts.append(ts)
            self.headers.append(h or None)

    def offset_for_time(self, t):
        hi = None
        for i, ts in enumerate(self.ts):
            hi = ts if hi is None else max(hi, ts)
            if hi >= t:
                return i
        return len(self.ts)

    def read(self, off, max_bytes, max_count):
        out, n, size = [], 0, 0
        while off + n < len(self.frames) and (max_count is None or n < max_count):
            f = self.frames[off + n]
            if n and size + len(f) > max_bytes:
                break
            out.append(f)
            size += len(f)
            n += 1
        return b"".join(out), n


def check(lg, model, reads, times):
    assert lg.next_offset == len(model.frames)
    for off, mb, mc in reads:
        off = off % (len(model.frames) + 1)
        r = lg.read(off, mb, mc)
        data, n = model.read(off, mb, mc)
        assert (r.start, r.count, r.next_offset) == (off, n, off + n)
        assert bytes(r.data) == data
        if isinstance(lg, PartitionLog):
            fd, pos, nbytes, cnt = lg.locate(off, mb, mc)
            assert cnt <= n and (cnt > 0) == (n > 0)
            if cnt:
                assert os.pread(fd, nbytes, pos) == model.read(off, mb, cnt)[0]
    for i in range(len(model.frames)):
        assert lg.headers(i) == model.headers[i]
    for t in times:
        assert lg.offset_for_time(t) == model.offset_for_time(t)
    for t in model.ts[:: max(1, len(model.ts) // 10)]:
        assert lg.offset_for_time(t) == model.offset_for_time(t)


@settings(max_examples=40, deadline=None, print_blob=True, suppress_health_check=list(HealthCheck))
@given(batches=st.lists(BATCH, min_size=1, max_size=12),
       reads=st.lists(st.tuples(st.integers(0, 10**4), st.integers(0, 1 << 21),
                                st.one_of(st.none(), st.integers(1, 50))), max_size=10),
       times=st.lists(st.integers(0, 20000), max_size=5),
       seg=st.sampled_from([2000, 50000, 1 << 22]), memory=st.booleans())
def test_random_batches_roundtrip(batches, reads, times, seg, memory):
    tmp = Path(tempfile.mkdtemp())
    cfg = LogConfig(segment_bytes=seg, index_interval_bytes=512, mem_tail_bytes=4096)
    try:
        lg = MemoryLog(5, mem_queue_size=10**9) if memory else PartitionLog(tmp, 5, cfg)
        model = Model()
        ts = 1000
        for items, step, flush, epoch in batches:
            ts = max(0, ts + step)
            bodies = [b for b, _ in items]
            hdrs = [h for _, h in items]
            base = lg.append(bodies, ts, epoch=epoch, headers=hdrs)
            assert base == len(model.frames)
            model.add(bodies, ts, hdrs, 5)
            if flush:
                lg.flush()
        lg.flush()
        check(lg, model, reads, times)
        if not memory:
            lg.close()
            lg = PartitionLog(tmp, 5, cfg)
            check(lg, model, reads, times)
            lg._drop_caches()  # cold reads through indexes and read-ahead
            check(lg, model, reads, times)
            infos = list(lg.batches())
            assert sum(b.count for b in infos) == len(model.frames)
        lg.close()
    finally:
        shutil.rmtree(tmp)


@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(batches=st.lists(BATCH, min_size=1, max_size=8), cuts=st.lists(st.integers(0, 400),
                                                                       min_size=1, max_size=3),
       seg=st.sampled_from([600, 5000, 1 << 22]), memory=st.booleans())
def test_truncate_then_append_matches_model(batches, cuts, seg, memory):
    tmp = Path(tempfile.mkdtemp())
    cfg = LogConfig(segment_bytes=seg, index_interval_bytes=256, mem_tail_bytes=2048)
    try:
        lg = MemoryLog(1, mem_queue_size=10**9) if memory else PartitionLog(tmp, 1, cfg)
        model = Model()
        ts = 10
        for round_, cut in enumerate(cuts):
            for items, step, flush, epoch in batches:
                ts = max(0, ts + step)
                bodies = [b[: 300 + round_] for b, _ in items]
                hdrs = [h for _, h in items]
                lg.append(bodies, ts, epoch=epoch, headers=hdrs)
                model.add(bodies, ts, hdrs, 1)
                if flush:
                    lg.flush()
            lg.flush()
            cut = min(cut, len(model.frames))
            lg.truncate_to(cut)
            del model.frames[cut:], model.ts[cut:], model.headers[cut:]
            check(lg, model, [(0, 1 << 30, None), (cut // 2, 500, 3)], [ts, 0])
        if not memory:
            lg.close()
            lg = PartitionLog(tmp, 1, cfg)
            lg._drop_caches()
            check(lg, model, [(0, 1 << 30, None), (1, 700, None)], [ts])
        lg.close()
    finally:
        shutil.rmtree(tmp)
