"""The nsq data source without a JVM: decoder, options, offset math, and the reader's
driver-side and executor-side calls against a real nsqd (pickled as Spark ships them)."""

from __future__ import annotations

import json
import pickle
import random
import struct

import pytest

pytest.importorskip("pyspark")
pa = pytest.importorskip("pyarrow")

from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows  # noqa: E402

from nsqx.nsqd.fetch_api import FETCH_HEADER, FETCH_MAGIC, encode_fetch_headers  # noqa: E402
from nsqx.spark.client import NodeClient, NsqSparkError, encode_pub_body  # noqa: E402
from nsqx.spark.decode import FetchFormatError, frames_to_batch, parse_fetch  # noqa: E402
from nsqx.spark.source import (  # noqa: E402
    NsqBatchReader,
    NsqBatchWriter,
    NsqDataSource,
    NsqOptionError,
    NsqStreamReader,
    Settings,
    _parse_offsets_spec,
    _rate_limit,
    arrow_schema,
    make_schema,
)
from nsqx.storage.message_id import ids_for_range  # noqa: E402
from nsqx.storage.records import build_frames_general  # noqa: E402
from tests.support.nsqd_process import NsqdFactory, NsqdProcess  # noqa: E402


def payload(bodies: list[bytes], start: int = 7, ts: int = 1_700_000_000_123_456_789,
            headers: dict[int, dict[str, bytes]] | None = None) -> bytes:
    frames = build_frames_general(bodies, ids_for_range(0, start, len(bodies)), ts)
    flags = 1 if headers is not None else 0
    head = FETCH_HEADER.pack(FETCH_MAGIC, 1, flags, 0, start, len(bodies), start + len(bodies),
                             0, start + len(bodies), len(frames))
    tail = encode_fetch_headers(sorted((headers or {}).items())) if headers is not None else b""
    return head + frames + tail


def decode(data: bytes, include_headers: bool = False) -> list[dict]:
    schema = arrow_schema(make_schema(include_headers))
    return frames_to_batch(parse_fetch(data), "tp", schema, include_headers).to_pylist()


@pytest.mark.parametrize("sizes", [
    [100] * 1000,  # uniform: the one-reshape path
    [1, 2, 3, 300, 4, 5] * 50,  # mixed, short runs: the plain loop
    [10] * 40 + [11] * 3 + [10] * 500 + [2000],  # long runs with breaks
    [1],
])
def test_decoder_matches_the_frames(sizes: list[int]) -> None:
    rnd = random.Random(len(sizes))
    bodies = [bytes(rnd.randrange(256) for _ in range(n)) for n in sizes]
    rows = decode(payload(bodies))
    assert [r["body"] for r in rows] == bodies
    assert [r["offset"] for r in rows] == list(range(7, 7 + len(bodies)))
    assert rows[0]["id"] == f"{7:016x}" and rows[-1]["id"] == f"{6 + len(bodies):016x}"
    assert {r["topic"] for r in rows} == {"tp"} and {r["partition"] for r in rows} == {0}
    ts = rows[0]["timestamp"]
    assert int(ts.timestamp() * 1_000_000) == 1_700_000_000_123_456


def test_decoder_random_sizes() -> None:
    rnd = random.Random(5)
    for _ in range(30):
        bodies = [b"%d" % i * rnd.choice([1, 1, 1, 7, 40]) for i in range(rnd.randrange(1, 400))]
        assert [r["body"] for r in decode(payload(bodies))] == bodies


def test_decoder_headers_and_errors() -> None:
    data = payload([b"a", b"b", b"c"], start=0,
                   headers={1: {"key": b"k", "tag": b"red", "trace_id": b"t1"}})
    rows = decode(data, include_headers=True)
    assert [(r["key"], r["tag"], r["trace_id"]) for r in rows] == [
        (None, None, None), (b"k", "red", "t1"), (None, None, None)]
    with pytest.raises(FetchFormatError):
        parse_fetch(data[:20])
    with pytest.raises(FetchFormatError):
        parse_fetch(b"XXXX" + data[4:])
    with pytest.raises(FetchFormatError):
        parse_fetch(data[:60])


def test_options_parsing() -> None:
    with pytest.raises(NsqOptionError, match="topic"):
        Settings.parse({"nsqd": "h:1"})
    with pytest.raises(NsqOptionError, match="nsqd' or 'lookupd"):
        Settings.parse({"topic": "t"})
    with pytest.raises(NsqOptionError, match="failOnDataLoss"):
        Settings.parse({"topic": "t", "nsqd": "h:1", "failOnDataLoss": "maybe"})
    with pytest.raises(NsqOptionError, match="minPartitions"):
        Settings.parse({"topic": "t", "nsqd": "h:1", "minPartitions": "zero"})
    s = Settings.parse({"Topic": "t", "NSQD": "h:1", "minpartitions": "4"})
    assert (s.topic, s.nsqd, s.min_partitions, s.fail_on_data_loss) == ("t", "h:1", 4, True)
    assert _parse_offsets_spec(" Earliest ", "t", "x") == "earliest"
    assert _parse_offsets_spec('{"0": 5}', "t", "x") == {"0": 5}
    assert _parse_offsets_spec('{"t": {"0": -2}}', "t", "x") == {"0": -2}
    assert _parse_offsets_spec('{"v": 1, "topic": "t", "p": {"0": 9}}', "t", "x") == {"0": 9}
    for bad in ("soon", "[1]", "{}", '{"0": -3}', '{"0": "1"}'):
        with pytest.raises(NsqOptionError):
            _parse_offsets_spec(bad, "t", "startingOffsets")
    assert pickle.loads(pickle.dumps(s)) == s


def test_rate_limit_shares_by_lag() -> None:
    cur = {"0": 0, "1": 100, "2": 50}
    target = {"0": 300, "1": 200, "2": 50}
    out = _rate_limit(cur, target, 100)
    assert sum(out[k] - cur[k] for k in cur) == 100
    assert out["2"] == 50 and out["0"] - 0 == 75 and out["1"] - 100 == 25
    assert _rate_limit(cur, target, 1000) == target
    out = _rate_limit({"0": 0, "1": 0, "2": 0}, {"0": 1, "1": 1, "2": 1}, 2)
    assert sum(out.values()) == 2


def test_encode_pub_body() -> None:
    assert encode_pub_body([b"ab", b"c"]) == (struct.pack(">I", 2) + struct.pack(">I", 2) + b"ab"
                                              + struct.pack(">I", 1) + b"c")
    assert encode_pub_body([b"x"], [b"k"]) == (struct.pack(">II", 1, 1) + b"k"
                                              + struct.pack(">I", 1) + b"x")


# ---------------------------------------------------------------- against a real nsqd

def publish(node: NsqdProcess, topic: str, bodies: list[bytes]) -> None:
    from nsqx.client import publish as pub

    pub(node.http_address, topic, bodies, http=True)


def rows_of(reader, parts) -> list[dict]:
    copy = pickle.loads(pickle.dumps(reader))  # executors get a pickled copy, as in Spark
    out = []
    for p in parts:
        for rb in copy.read(pickle.loads(pickle.dumps(p))):
            out += rb.to_pylist()
    return out


def batch_reader(node: NsqdProcess, **opts: str) -> NsqBatchReader:
    options = {"nsqd": node.http_address, "topic": "t", **opts}
    ds = NsqDataSource(options)
    return ds.reader(ds.schema())


def test_batch_reader_ranges_and_splits(nsqd: NsqdProcess) -> None:
    publish(nsqd, "t", [b"m%04d" % i for i in range(1000)])
    r = batch_reader(nsqd, minPartitions="4")
    parts = r.partitions()
    assert isinstance(parts, list) and len(parts) == 4
    assert [(p.start, p.end) for p in parts] == [(0, 250), (250, 500), (500, 750), (750, 1000)]
    rows = rows_of(r, parts)
    assert [x["offset"] for x in rows] == list(range(1000))
    assert rows[10]["body"] == b"m0010"
    r = batch_reader(nsqd, startingOffsets='{"0": 990}', endingOffsets='{"0": 995}',
                     fetchMaxBytes="60")
    assert [x["body"] for x in rows_of(r, r.partitions())] == [b"m%04d" % i
                                                               for i in range(990, 995)]
    assert batch_reader(nsqd, startingOffsets="latest").partitions() == []
    synced = NodeClient(nsqd.http_address).offsets("t")[0]["synced"]
    parts = batch_reader(nsqd, syncedOnly="true").partitions()
    assert sum(p.end - p.start for p in parts) == synced <= 1000


def test_batch_reader_bad_input(nsqd_factory: NsqdFactory) -> None:
    node = nsqd_factory.start()
    publish(node, "t", [b"x"] * 10)
    with pytest.raises(NsqSparkError, match="does not exist") as ei:
        batch_reader(node, topic="nope").partitions()
    assert ei.value.code == "TOPIC_NOT_FOUND"
    with pytest.raises(NsqSparkError, match="ends at 10"):
        batch_reader(node, endingOffsets='{"0": 50}').partitions()
    parts = batch_reader(node, endingOffsets='{"0": 50}', failOnDataLoss="false").partitions()
    assert [(p.start, p.end) for p in parts] == [(0, 10)]
    with pytest.raises(NsqOptionError, match="unknown partitions"):
        batch_reader(node, startingOffsets='{"7": 0}').partitions()
    with pytest.raises(NsqOptionError, match="after the ending"):
        batch_reader(node, startingOffsets='{"0": 8}', endingOffsets='{"0": 3}').partitions()
    with pytest.raises(NsqOptionError, match="startingTimestamp"):
        batch_reader(node, startingTimestamp="yesterday").partitions()
    # nsqd gone between planning and reading, and at planning
    r = batch_reader(node)
    parts = r.partitions()
    node.kill()
    with pytest.raises(NsqSparkError, match="unreachable"):
        rows_of(r, parts)
    with pytest.raises(NsqSparkError, match="unreachable"):
        batch_reader(node).partitions()


def test_timestamps_select_ranges(nsqd: NsqdProcess) -> None:
    import time

    publish(nsqd, "t", [b"old"] * 5)
    time.sleep(0.05)
    t_mid = int(time.time() * 1000)
    time.sleep(0.05)
    publish(nsqd, "t", [b"new"] * 3)
    r = batch_reader(nsqd, startingTimestamp=str(t_mid))
    assert [x["body"] for x in rows_of(r, r.partitions())] == [b"new"] * 3
    r = batch_reader(nsqd, endingTimestamp=str(t_mid))
    assert [x["body"] for x in rows_of(r, r.partitions())] == [b"old"] * 5


def stream_reader(nodes: str, **opts: str) -> NsqStreamReader:
    ds = NsqDataSource({"nsqd": nodes, "topic": "t", **opts})
    return ds.streamReader(ds.schema())


def test_stream_reader_offsets_limits_and_new_partitions(nsqd_factory: NsqdFactory) -> None:
    a = nsqd_factory.start(name="a")
    b = nsqd_factory.start(name="b")
    publish(a, "t", [b"a%d" % i for i in range(100)])
    sr = stream_reader(f"{a.http_address},{b.http_address}", startingOffsets="earliest",
                       maxOffsetsPerTrigger="30")
    start = sr.initialOffset()
    ka = f"{a.http_address}/0"
    assert start == {"v": 1, "topic": "t", "p": {ka: 0}}
    assert sr.getDefaultReadLimit() == ReadMaxRows(30)
    end = sr.latestOffset(start, sr.getDefaultReadLimit())
    assert end["p"] == {ka: 30}
    assert sr.reportLatestOffset()["p"] == {ka: 100}
    assert [x["body"] for x in rows_of(sr, sr.partitions(start, end))] == [
        b"a%d" % i for i in range(30)]
    # the topic appears on node b: a new partition, read from its beginning
    publish(b, "t", [b"b%d" % i for i in range(10)])
    end2 = sr.latestOffset(end, ReadAllAvailable())
    kb = f"{b.http_address}/0"
    assert end2["p"] == {ka: 100, kb: 10}
    rows = rows_of(sr, sr.partitions(end, end2))
    assert sorted(x["body"] for x in rows) == sorted(
        [b"a%d" % i for i in range(30, 100)] + [b"b%d" % i for i in range(10)])
    assert sr.partitions(end2, end2) == []
    # availableNow: capped at what existed when it was prepared
    sr.prepareForTriggerAvailableNow()
    publish(a, "t", [b"late"])
    assert sr.latestOffset(end2, ReadAllAvailable())["p"][ka] == 100
    # checkpoint of another topic / version is refused
    with pytest.raises(NsqSparkError, match="topic"):
        sr.latestOffset({"v": 1, "topic": "other", "p": {}}, ReadAllAvailable())
    with pytest.raises(NsqSparkError, match="unsupported"):
        sr.latestOffset({"v": 9, "topic": "t", "p": {}}, ReadAllAvailable())
    sr.commit(end2)
    # a checkpoint beyond the log's end (log replaced): clear error, or skip when allowed
    with pytest.raises(NsqSparkError, match="log ends at"):
        sr.latestOffset({"v": 1, "topic": "t", "p": {ka: 5000}}, ReadAllAvailable())
    lenient = stream_reader(a.http_address, failOnDataLoss="false")
    assert lenient.latestOffset({"v": 1, "topic": "t", "p": {"0": 5000}},
                                ReadAllAvailable())["p"] == {"0": 101}


def test_stream_reader_defaults_to_latest(nsqd: NsqdProcess) -> None:
    publish(nsqd, "t", [b"x"] * 5)
    sr = stream_reader(nsqd.http_address)
    assert sr.initialOffset()["p"] == {"0": 5}
    assert sr.getDefaultReadLimit() == ReadAllAvailable()
    ds = NsqDataSource({"nsqd": nsqd.http_address, "topic": "t", "endingOffsets": "latest"})
    with pytest.raises(NsqOptionError, match="batch reads only"):
        ds.streamReader(ds.schema())


def test_writer_publishes_in_chunks_once(nsqd: NsqdProcess) -> None:
    from pyspark.sql.types import BinaryType, StringType, StructField, StructType

    schema = StructType([StructField("body", StringType()), StructField("key", BinaryType())])
    opts = {"nsqd": nsqd.http_address, "topic": "out", "batchSize": "40", "writerId": "w1"}
    w = NsqDataSource(opts).writer(schema, False)
    w = pickle.loads(pickle.dumps(w))

    def batches():
        for j in range(3):
            yield pa.RecordBatch.from_pydict({
                "body": [f"m{j}-{i}" for i in range(50)],
                "key": [b"k%d" % (i % 3) if i % 2 else None for i in range(50)]})

    msg = w.write(batches())
    assert (msg.messages, msg.duplicates) == (150, 0)
    msg = w.write(batches())  # a retried task: nothing new
    assert (msg.messages, msg.duplicates) == (150, 150)
    c = NodeClient(nsqd.http_address)
    assert c.offsets("out")[0]["latest"] == 150
    r = batch_reader(nsqd, topic="out", includeHeaders="true")
    rows = rows_of(r, r.partitions())
    assert [x["body"] for x in rows] == [f"m{j}-{i}".encode() for j in range(3) for i in range(50)]
    assert [x["key"] for x in rows[:4]] == [None, b"k1", None, b"k0"]
    with pytest.raises(NsqOptionError, match="body"):
        NsqBatchWriter({"nsqd": "h:1", "topic": "t"}, StructType([StructField("x", StringType())]),
                       None)
    bad = NsqDataSource(opts).writer(schema, False)
    with pytest.raises(NsqSparkError, match="empty"):
        bad.write(iter([pa.RecordBatch.from_pydict({"body": ["ok", ""], "key": [None, None]})]))
    assert json.loads(json.dumps(c.offsets("out")))[0]["latest"] == 150


def test_lookupd_discovery(nsqd_factory: NsqdFactory, tmp_path) -> None:
    import time

    from tests.support.lookupd_process import LookupdFactory

    lf = LookupdFactory(tmp_path / "lookupd")
    (tmp_path / "lookupd").mkdir()
    try:
        lk = lf.start()
        node = nsqd_factory.start([f"--lookupd-tcp-address={lk.tcp_address}"])
        publish(node, "t", [b"x"] * 4)
        ds = NsqDataSource({"lookupd": lk.http_address, "topic": "t"})
        deadline = time.monotonic() + 10
        while True:
            try:
                parts = ds.reader(ds.schema()).partitions()
                break
            except NsqSparkError:
                assert time.monotonic() < deadline
                time.sleep(0.2)
        (part,) = parts
        assert (part.key, part.start, part.end) == (f"{part.node}/0", 0, 4)
        assert part.node.endswith(f":{node.http_port}")
        ds = NsqDataSource({"lookupd": lk.http_address, "topic": "none"})
        with pytest.raises(NsqSparkError, match="no nsqd has it"):
            ds.reader(ds.schema()).partitions()
        # a writer to a topic no nsqd has yet publishes to a node lookupd knows
        from pyspark.sql.types import StringType, StructField, StructType

        w = NsqDataSource({"lookupd": lk.http_address, "topic": "fresh"}).writer(
            StructType([StructField("body", StringType())]), False)
        assert w.write(iter([pa.RecordBatch.from_pydict({"body": ["a", "b"]})])).messages == 2
        assert NodeClient(node.http_address).offsets("fresh")[0]["latest"] == 2
    finally:
        lf.close()
