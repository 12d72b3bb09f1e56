"""The ``nsq`` PySpark Python data source: batch and streaming reads by offset, writes.

Reads go through nsqd's ``/nsqx/offsets`` and ``/nsqx/fetch`` (``nsqx.nsqd.fetch_api``), never
through channels, so reading does not consume anything. Offsets are per *source partition*,
named by a string key: ``"P"`` (the partition number) when one nsqd is given, ``"host:port/P"``
when several nodes serve the topic (a list in ``nsqd`` or ``lookupd`` discovery).

A topic of an nsqx cluster found through ``lookupd`` (its ``/lookup?access=r&metainfo=true``
maps every partition to its leader) is read once per partition, at the partition's leader,
up to the leader's high watermark (``latest`` of its ``/nsqx/offsets``: what every in-sync
replica has, so never a record a failover could take back; ``/nsqx/cluster/state`` says
whether the node still leads), under the key ``"P"``,
which survives leader changes; discovery waits (up to ``timeout``) while a partition has no
leader, and an executor whose leader dies mid-read goes on at the new one.

Options (names are case-insensitive):

==========================  ==================================================================
``nsqd``                    nsqd HTTP address(es), ``host:port`` or URL, comma separated
``lookupd``                 nsqlookupd HTTP address(es), used when ``nsqd`` is not given
``topic``                   the topic (required)
``startingOffsets``         ``earliest`` (batch default), ``latest`` (stream default) or JSON
                            ``{"0": 42}`` / ``{"TOPIC": {"0": 42}}``; -2 = earliest, -1 = latest
``endingOffsets``           batch only: ``latest`` (default) or JSON as above
``startingTimestamp``       ms since the epoch: start at the first record at or after it
``endingTimestamp``         batch only, ms: stop before the first record at or after it
``minPartitions``           split ranges so that there are at least this many Spark partitions
``maxRecordsPerPartition``  split ranges longer than this (default 1,000,000)
``maxOffsetsPerTrigger``    stream: at most this many records per micro-batch (spread over
                            partitions in proportion to their lag)
``failOnDataLoss``          ``true`` (default): fail when requested offsets are gone
                            (retention) or out of range; ``false``: skip to what exists
``includeHeaders``          ``true``: add columns ``key`` (binary), ``tag``, ``trace_id``
                            (strings) from the records' extension headers
``fetchMaxBytes``           bytes per fetch request (default 8 MiB; one Arrow batch each)
``syncedOnly``              ``true``: read only records nsqd has fsynced, so a range once read
                            survives even a power loss of the node (adds up to nsqd's
                            ``--sync-timeout`` of latency); default ``false``: every record
                            written, which survives a crash of the nsqd process
``authSecret``              secret for nsqd's ``--auth-http-address`` (sent as a Bearer token)
``timeout``                 HTTP timeout in seconds (default 30)
``writerId``                write: identity of the writer for idempotent publishing (default:
                            derived from ``checkpointLocation`` or the streaming query id; a
                            random one per batch job)
``batchSize``               write: messages per publish request (default 5000)
``maxBatchBytes``           write: bytes per publish request (default 4 MiB)
==========================  ==================================================================

Schema: ``topic`` string, ``partition`` int, ``offset`` bigint, ``id`` string (NSQ's 16-hex
message id), ``timestamp`` timestamp (publish time, UTC), ``body`` binary, plus the header
columns with ``includeHeaders``.

Writing: a DataFrame with ``body`` (binary or string) and optional ``key`` (binary or string;
stored as the ``key`` extension header) and ``partition`` (int) columns. Every executor task
publishes its rows directly with ``/nsqx/pub`` in chunks keyed ``(writer, batch id, task
partition + chunk number)``; nsqd appends each key at most once, so a retried task or a
replayed micro-batch does not duplicate messages (exactly-once into the topic as long as the
input of a batch is deterministic, which it is when it comes from the ``nsq`` source).
Writes go to the first nsqd of the ``nsqd`` list, or the first (sorted) that the lookupds name
for the topic (any nsqd they know when none has it yet); for a cluster topic, each
partition's rows go to its leader, and a publish whose leader died or moved is sent again
with the same key to the leader lookupd names next. A failed publish fails the task and so
the job or query.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from nsqx.spark.client import (
    NodeClient,
    NsqSparkError,
    cluster_leaders,
    encode_pub_body,
    resolve_nodes,
)
from nsqx.spark.decode import frames_to_batch, parse_fetch

__all__ = ["NsqDataSource", "NsqPartition", "NsqOptionError", "BASE_SCHEMA", "HEADER_FIELDS",
           "make_schema"]

log = logging.getLogger("nsqx.spark")

EARLIEST = -2
LATEST = -1
OFFSETS_VERSION = 1

BASE_FIELDS = [
    StructField("topic", StringType(), False),
    StructField("partition", IntegerType(), False),
    StructField("offset", LongType(), False),
    StructField("id", StringType(), False),
    StructField("timestamp", TimestampType(), False),
    StructField("body", BinaryType(), False),
]
HEADER_FIELDS = [
    StructField("key", BinaryType(), True),
    StructField("tag", StringType(), True),
    StructField("trace_id", StringType(), True),
]
BASE_SCHEMA = StructType(BASE_FIELDS)


class NsqOptionError(ValueError):
    """An option of the ``nsq`` source is missing or malformed."""


def make_schema(include_headers: bool) -> StructType:
    return StructType(BASE_FIELDS + (HEADER_FIELDS if include_headers else []))


def arrow_schema(schema: StructType) -> pa.Schema:
    fields = []
    for f in schema.fields:
        t = {"topic": pa.string(), "partition": pa.int32(), "offset": pa.int64(),
             "id": pa.string(), "timestamp": pa.timestamp("us", tz="UTC"), "body": pa.binary(),
             "key": pa.binary(), "tag": pa.string(), "trace_id": pa.string()}[f.name]
        fields.append(pa.field(f.name, t, nullable=f.nullable))
    return pa.schema(fields)


# ---------------------------------------------------------------- options

def _bool(opts: dict[str, str], name: str, default: bool) -> bool:
    v = opts.get(name.lower())
    if v is None:
        return default
    s = str(v).strip().lower()
    if s in ("true", "1", "yes"):
        return True
    if s in ("false", "0", "no"):
        return False
    raise NsqOptionError(f"option {name} must be true or false, not {v!r}")


def _int(opts: dict[str, str], name: str, default: int | None, lo: int = 1) -> int | None:
    v = opts.get(name.lower())
    if v is None or str(v).strip() == "":
        return default
    try:
        n = int(str(v).strip())
    except ValueError:
        raise NsqOptionError(f"option {name} must be an integer, not {v!r}") from None
    if n < lo:
        raise NsqOptionError(f"option {name} must be >= {lo}, not {n}")
    return n


@dataclass(frozen=True)
class Settings:
    """Everything parsed from the options once, on the driver; shipped to executors."""

    topic: str
    nsqd: str | None
    lookupd: str | None
    fail_on_data_loss: bool
    include_headers: bool
    fetch_max_bytes: int
    secret: str | None
    timeout: float
    min_partitions: int
    max_records_per_partition: int
    synced_only: bool = False

    @classmethod
    def parse(cls, options: dict[str, str]) -> Settings:
        opts = {str(k).lower(): v for k, v in options.items()}
        topic = opts.get("topic")
        if not topic:
            raise NsqOptionError("option 'topic' is required")
        nsqd = opts.get("nsqd") or None
        lookupd = opts.get("lookupd") or None
        if not nsqd and not lookupd:
            raise NsqOptionError("option 'nsqd' or 'lookupd' is required")
        try:
            timeout = float(opts.get("timeout", 30))
        except ValueError:
            raise NsqOptionError(f"option timeout must be a number, not {opts['timeout']!r}"
                                 ) from None
        return cls(
            topic=topic, nsqd=nsqd, lookupd=lookupd,
            fail_on_data_loss=_bool(opts, "failOnDataLoss", True),
            include_headers=_bool(opts, "includeHeaders", False),
            fetch_max_bytes=_int(opts, "fetchMaxBytes", 8 << 20) or 0,
            secret=opts.get("authsecret") or None,
            timeout=timeout,
            min_partitions=_int(opts, "minPartitions", 1) or 1,
            max_records_per_partition=_int(opts, "maxRecordsPerPartition", 1_000_000) or 0,
            synced_only=_bool(opts, "syncedOnly", False),
        )


@dataclass(frozen=True)
class PartInfo:
    key: str
    node: str
    partition: int
    earliest: int
    latest: int
    for_ts: int | None = None


def _discover(s: Settings, timestamp_ms: int | None = None) -> dict[str, PartInfo]:
    """Partitions of the topic on every node: key -> PartInfo (sorted by key)."""
    ts_ns = None if timestamp_ms is None else int(timestamp_ms) * 1_000_000
    if not s.nsqd and s.lookupd:
        found = cluster_leaders(s.lookupd, s.topic, s.timeout)
        if found is not None:
            return _discover_cluster(s, found, ts_ns)
    nodes = resolve_nodes(s.nsqd, s.lookupd, s.topic, s.timeout)
    if not nodes:
        raise NsqSparkError(f"topic {s.topic!r}: no nsqd has it (lookupd {s.lookupd})",
                            "TOPIC_NOT_FOUND")
    prefix = len(nodes) > 1 or not s.nsqd
    out: dict[str, PartInfo] = {}
    missing = []
    for node in nodes:
        c = NodeClient(node, timeout=s.timeout, secret=s.secret, retries=1)
        try:
            parts = c.offsets(s.topic, ts_ns)
        except NsqSparkError as exc:
            if exc.code != "TOPIC_NOT_FOUND":
                raise
            missing.append(node)  # not (yet) on this node: its partitions come later
            continue
        finally:
            c.close()
        for p in parts:
            pid = int(p["partition"])
            key = f"{node}/{pid}" if prefix else str(pid)
            out[key] = _part_info(s, key, node, p)
    if not out:
        raise NsqSparkError(f"topic {s.topic!r} does not exist on nsqd {', '.join(missing)}",
                            "TOPIC_NOT_FOUND")
    return dict(sorted(out.items(), key=lambda kv: _sort_key(kv[0])))


def _part_info(s: Settings, key: str, node: str, p: dict[str, Any]) -> PartInfo:
    """PartInfo of one entry of /nsqx/offsets (whose ``latest`` is, on a cluster leader, the
    high watermark: nsqd never offers a tail a failover may take back)."""
    latest = int(p["latest"])
    if s.synced_only:
        latest = min(latest, int(p.get("synced", latest)))
    for_ts = p.get("offset_for_timestamp")
    return PartInfo(key, node, int(p["partition"]), int(p["earliest"]), latest,
                    None if for_ts is None else min(int(for_ts), latest))


class _NotLeader(Exception):
    """The node lookupd named is not (or no longer) the partition's leader, or is gone."""


def _leaders(s: Settings, found: tuple[int, dict[int, str]] | None = None,
             deadline: float | None = None) -> dict[int, str]:
    assert s.lookupd
    return wait_leaders(s.lookupd, s.topic, s.timeout, found, deadline)


def wait_leaders(lookupd: str, topic: str, timeout: float,
                 found: tuple[int, dict[int, str]] | None = None,
                 deadline: float | None = None) -> dict[int, str]:
    """A cluster topic's partition -> leader HTTP address, every partition present: waits
    (up to ``timeout``) while a partition has no leader, as during a failover."""
    deadline = deadline or time.monotonic() + timeout
    while True:
        if found is None:
            found = cluster_leaders(lookupd, topic, timeout)
            if found is None:
                raise NsqSparkError(f"topic {topic!r} is not a cluster topic of lookupd "
                                    f"{lookupd}", "TOPIC_NOT_FOUND")
        count, leaders = found
        missing = [p for p in range(count) if p not in leaders]
        if count and not missing:
            return leaders
        if time.monotonic() >= deadline:
            raise NsqSparkError(f"topic {topic!r}: partitions {missing} have no leader "
                                f"(lookupd {lookupd})", "NO_LEADER")
        time.sleep(0.2)
        found = None


def _discover_cluster(s: Settings, found: tuple[int, dict[int, str]], ts_ns: int | None
                      ) -> dict[str, PartInfo]:
    """A cluster topic: every partition once, at its leader, keyed by its number (a key
    that survives failovers), readable up to the leader's high watermark (what its whole ISR
    has: never a record a failover could take back)."""
    deadline = time.monotonic() + s.timeout
    while True:
        leaders = _leaders(s, found, deadline)
        found = None
        try:
            out = _read_leaders(s, leaders, ts_ns)
        except _NotLeader as exc:
            if time.monotonic() >= deadline:
                raise NsqSparkError(f"topic {s.topic!r}: {exc}", "NO_LEADER") from None
            log.info("topic %s: %s; asking lookupd again", s.topic, exc)
            time.sleep(0.2)
            continue
        return dict(sorted(out.items(), key=lambda kv: _sort_key(kv[0])))


def _read_leaders(s: Settings, leaders: dict[int, str], ts_ns: int | None
                  ) -> dict[str, PartInfo]:
    by_node: dict[str, list[int]] = {}
    for pid, node in leaders.items():
        by_node.setdefault(node, []).append(pid)
    out: dict[str, PartInfo] = {}
    for node, pids in by_node.items():
        c = NodeClient(node, timeout=s.timeout, secret=s.secret, retries=1)
        try:
            offsets = {int(p["partition"]): p for p in c.offsets(s.topic, ts_ns)}
            state = c.cluster_state()
        except NsqSparkError as exc:
            if exc.status is None or exc.code == "TOPIC_NOT_FOUND" or exc.status >= 500:
                raise _NotLeader(f"leader {node} did not answer ({exc})") from None
            raise
        finally:
            c.close()
        for pid in pids:
            st = state.get((s.topic, pid))
            if pid not in offsets or st is None or st.get("role") != "leader":
                raise _NotLeader(f"{node} does not lead partition {pid} (any more)")
            out[str(pid)] = _part_info(s, str(pid), node, offsets[pid])
    return out


def _part_from_key(key: str, s: Settings, lo: int, hi: int,
                   leaders: dict[int, str] | None = None) -> PartInfo:
    node, _, pid = key.rpartition("/")
    try:
        n = int(pid)
    except ValueError:
        raise NsqSparkError(f"bad partition key {key!r} in offsets") from None
    if not node:
        node = (s.nsqd or "").split(",")[0].strip() or (leaders or {}).get(n, "")
    return PartInfo(key, node, n, lo, hi)


def _in_cluster(s: Settings, key: str) -> bool:
    """A partition of a cluster topic (found through lookupd, keyed by its number alone):
    read at whichever node leads it."""
    return not s.nsqd and bool(s.lookupd) and "/" not in key


def _leader_moved(exc: NsqSparkError) -> bool:
    """An error of a fetch that asking lookupd for the partition's leader again may cure."""
    return (exc.status is None or exc.status >= 500
            or exc.code in ("TOPIC_NOT_FOUND", "PARTITION_NOT_FOUND"))


def _sort_key(key: str) -> tuple:
    node, _, p = key.rpartition("/")
    return (node, int(p) if p.isdigit() else p)


def _parse_offsets_spec(spec: str, topic: str, name: str) -> dict[str, int] | str:
    """'earliest' | 'latest' | JSON map -> str or {key: offset}."""
    s = spec.strip()
    if s.lower() in ("earliest", "latest"):
        return s.lower()
    try:
        doc = json.loads(s)
    except ValueError:
        raise NsqOptionError(f"option {name} must be 'earliest', 'latest' or JSON, not {spec!r}"
                             ) from None
    if isinstance(doc, dict) and "p" in doc and "topic" in doc and isinstance(doc["p"], dict):
        doc = doc["p"]  # our own checkpoint format
    elif isinstance(doc, dict) and topic in doc and isinstance(doc[topic], dict):
        doc = doc[topic]
    if not isinstance(doc, dict) or not doc:
        raise NsqOptionError(f"option {name}: expected a JSON object of partition -> offset, "
                             f"got {spec!r}")
    out = {}
    for k, v in doc.items():
        if not isinstance(v, int) or isinstance(v, bool) or v < EARLIEST:
            raise NsqOptionError(f"option {name}: offset of partition {k!r} must be an "
                                 f"integer >= -2, not {v!r}")
        out[str(k)] = v
    return out


def _resolve(spec: dict[str, int] | str, parts: dict[str, PartInfo], default_new: int,
             name: str) -> dict[str, int]:
    if spec == "earliest":
        return {k: p.earliest for k, p in parts.items()}
    if spec == "latest":
        return {k: p.latest for k, p in parts.items()}
    assert isinstance(spec, dict)
    unknown = sorted(set(spec) - set(parts))
    if unknown:
        raise NsqOptionError(f"option {name}: unknown partitions {unknown} (topic has "
                             f"{sorted(parts)})")
    out = {}
    for k, p in parts.items():
        v = spec.get(k, default_new)
        out[k] = p.earliest if v == EARLIEST else p.latest if v == LATEST else v
    return out


def _ts_option(opts: dict[str, str], name: str) -> int | None:
    v = opts.get(name.lower())
    if v is None or str(v).strip() == "":
        return None
    try:
        return int(str(v).strip())
    except ValueError:
        raise NsqOptionError(f"option {name} must be milliseconds since the epoch, not {v!r}"
                             ) from None


# ---------------------------------------------------------------- reading

@dataclass
class NsqPartition(InputPartition):
    """One offset range of one log partition: everything read() needs."""

    topic: str
    key: str
    node: str
    partition: int
    start: int
    end: int
    settings: Settings


def _split_ranges(ranges: list[tuple[PartInfo, int, int]], s: Settings) -> list[NsqPartition]:
    total = sum(e - b for _, b, e in ranges)
    per = s.max_records_per_partition or total or 1
    if s.min_partitions > 1 and total > 0:
        per = min(per, max(1, -(-total // s.min_partitions)))
    out = []
    for p, b, e in ranges:
        cur = b
        while cur < e:
            nxt = min(e, cur + per)
            out.append(NsqPartition(s.topic, p.key, p.node, p.partition, cur, nxt, s))
            cur = nxt
    return out


def read_partition(part: NsqPartition, schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """Fetch [start, end) in chunks and yield one RecordBatch per chunk."""
    s = part.settings
    cluster = _in_cluster(s, part.key)
    node = part.node or (_leaders(s)[part.partition] if cluster else part.node)
    c = NodeClient(node, timeout=s.timeout, secret=s.secret)
    cur = part.start
    deadline = time.monotonic() + s.timeout
    try:
        while cur < part.end:
            try:
                payload = c.fetch(part.topic, part.partition, cur, part.end, s.fetch_max_bytes,
                                  s.include_headers)
            except NsqSparkError as exc:
                if cluster and _leader_moved(exc) and time.monotonic() < deadline:
                    # the leader died or moved: the range (below the high watermark it had
                    # when planned) is on every ISR member, so the new leader serves it
                    log.warning("%s/%s: %s; asking lookupd for the leader", part.topic,
                                part.key, exc)
                    time.sleep(0.2)
                    c.close()
                    c = NodeClient(_leaders(s)[part.partition], timeout=s.timeout,
                                   secret=s.secret)
                    continue
                if exc.code == "OFFSET_OUT_OF_RANGE" and not s.fail_on_data_loss:
                    log.warning("%s/%s: offsets %d..%d out of range; skipped", part.topic,
                                part.key, cur, part.end)
                    return
                raise
            res = parse_fetch(payload)
            if res.start > cur:
                if s.fail_on_data_loss:
                    raise NsqSparkError(
                        f"topic {part.topic} partition {part.key}: offsets {cur}..{res.start - 1}"
                        f" are gone (retention; earliest is {res.earliest}). Set failOnDataLoss"
                        f"=false to skip them", "DATA_LOSS")
                log.warning("%s/%s: offsets %d..%d lost, skipped", part.topic, part.key, cur,
                            res.start - 1)
            if res.count == 0:
                if s.fail_on_data_loss:
                    raise NsqSparkError(
                        f"topic {part.topic} partition {part.key}: offsets {res.start}.."
                        f"{part.end - 1} no longer exist (the log ends at {res.latest})",
                        "DATA_LOSS")
                return
            yield frames_to_batch(res, part.topic, schema, s.include_headers)
            cur = res.next_offset
    finally:
        c.close()


class NsqBatchReader(DataSourceReader):
    def __init__(self, settings: Settings, options: dict[str, str], schema: StructType) -> None:
        self.settings = settings
        self.options = options
        self.schema = schema

    def partitions(self) -> list[NsqPartition]:
        s = self.settings
        o = self.options
        start_ts = _ts_option(o, "startingTimestamp")
        end_ts = _ts_option(o, "endingTimestamp")
        parts = _discover(s)
        if start_ts is not None:
            starts = {k: p.for_ts for k, p in _discover(s, start_ts).items() if k in parts}
        else:
            spec = _parse_offsets_spec(o.get("startingoffsets", "earliest"), s.topic,
                                       "startingOffsets")
            starts = _resolve(spec, parts, EARLIEST, "startingOffsets")
        if end_ts is not None:
            ends = {k: p.for_ts for k, p in _discover(s, end_ts).items() if k in parts}
        else:
            spec = _parse_offsets_spec(o.get("endingoffsets", "latest"), s.topic,
                                       "endingOffsets")
            if spec == "earliest":
                raise NsqOptionError("endingOffsets cannot be 'earliest'")
            ends = _resolve(spec, parts, LATEST, "endingOffsets")
        ranges = []
        for k, p in parts.items():
            b, e = int(starts[k]), int(ends[k])
            if e > p.latest:
                if s.fail_on_data_loss:
                    raise NsqSparkError(f"endingOffsets: partition {k} ends at {p.latest}, "
                                        f"not {e}", "OFFSET_OUT_OF_RANGE")
                e = p.latest
            if b < p.earliest:
                if s.fail_on_data_loss:
                    raise NsqSparkError(
                        f"startingOffsets: partition {k} starts at {p.earliest} (older records"
                        f" are gone), not {b}. Set failOnDataLoss=false to skip them",
                        "DATA_LOSS")
                b = p.earliest
            if b > e:
                raise NsqOptionError(f"partition {k}: starting offset {b} is after the ending "
                                     f"offset {e}")
            if e > b:
                ranges.append((p, b, e))
        return _split_ranges(ranges, s)

    def read(self, partition: NsqPartition) -> Iterator[pa.RecordBatch]:
        yield from read_partition(partition, arrow_schema(self.schema))


def encode_offsets(topic: str, offsets: dict[str, int]) -> dict[str, Any]:
    return {"v": OFFSETS_VERSION, "topic": topic,
            "p": {k: int(offsets[k]) for k in sorted(offsets, key=_sort_key)}}


class NsqStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets ``{"v": 1, "topic": T, "p": {"0": next offset}}`` live in Spark's checkpoint."""

    def __init__(self, settings: Settings, options: dict[str, str], schema: StructType) -> None:
        self.settings = settings
        self.options = options
        self.schema = schema
        self.max_per_trigger = _int(options, "maxOffsetsPerTrigger", None)
        self._latest: dict[str, int] | None = None
        self._available_now: dict[str, int] | None = None

    def _check(self, offsets: dict) -> dict[str, int]:
        if not isinstance(offsets, dict) or offsets.get("v") != OFFSETS_VERSION:
            raise NsqSparkError(f"unsupported offsets in the checkpoint: {offsets!r}")
        if offsets.get("topic") != self.settings.topic:
            raise NsqSparkError(f"the checkpoint is for topic {offsets.get('topic')!r}, not "
                                f"{self.settings.topic!r}")
        return {str(k): int(v) for k, v in offsets["p"].items()}

    def initialOffset(self) -> dict:
        s = self.settings
        ts = _ts_option(self.options, "startingTimestamp")
        parts = _discover(s, ts)
        if ts is not None:
            return encode_offsets(s.topic, {k: int(p.for_ts) for k, p in parts.items()})
        spec = _parse_offsets_spec(self.options.get("startingoffsets", "latest"), s.topic,
                                   "startingOffsets")
        return encode_offsets(s.topic, _resolve(spec, parts, EARLIEST, "startingOffsets"))

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.max_per_trigger:
            return ReadMaxRows(self.max_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._available_now = {k: p.latest for k, p in _discover(self.settings).items()}

    def reportLatestOffset(self) -> dict | None:
        if self._latest is None:
            return None
        return encode_offsets(self.settings.topic, self._latest)

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        s = self.settings
        cur = self._check(start)
        parts = _discover(s)
        self._latest = {k: p.latest for k, p in parts.items()}
        target: dict[str, int] = {}
        for k, p in parts.items():
            if k not in cur:  # a new partition: from its beginning
                log.info("topic %s: new partition %s", s.topic, k)
                cur[k] = p.earliest
            b = cur[k]
            if b < p.earliest:
                if s.fail_on_data_loss:
                    raise NsqSparkError(
                        f"topic {s.topic} partition {k}: offsets {b}..{p.earliest - 1} are gone "
                        "(retention). Set failOnDataLoss=false to skip them", "DATA_LOSS")
                log.warning("topic %s partition %s: offsets %d..%d lost", s.topic, k, b,
                            p.earliest - 1)
                cur[k] = b = p.earliest
            if b > p.latest:
                if s.fail_on_data_loss:
                    raise NsqSparkError(
                        f"topic {s.topic} partition {k}: the checkpoint is at offset {b} but the "
                        f"log ends at {p.latest}", "OFFSET_OUT_OF_RANGE")
                cur[k] = b = p.latest
            hi = p.latest
            if self._available_now is not None:
                hi = min(hi, self._available_now.get(k, p.earliest))
            target[k] = max(b, hi)
        for k, b in cur.items():  # partitions that disappeared keep their offset
            target.setdefault(k, b)
        if isinstance(limit, ReadMaxRows):
            target = _rate_limit(cur, target, limit.max_rows)
        return encode_offsets(s.topic, target)

    def partitions(self, start: dict, end: dict) -> list[NsqPartition]:
        s = self.settings
        a, b = self._check(start), self._check(end)
        parts = _discover(s) if any(k not in a for k in b) else {}
        leaders = None
        if any(_in_cluster(s, k) and b[k] > a.get(k, -1) for k in b):
            leaders = _leaders(s)  # where each cluster partition is read now
        ranges = []
        for k in sorted(b, key=_sort_key):
            e = b[k]
            lo = a.get(k)
            if lo is None:  # new since the last batch: from its earliest offset
                p = parts.get(k)
                lo = p.earliest if p is not None else e
            if e > lo:
                ranges.append((_part_from_key(k, s, lo, e, leaders), lo, e))
        return _split_ranges(ranges, s)

    def read(self, partition: NsqPartition) -> Iterator[pa.RecordBatch]:
        yield from read_partition(partition, arrow_schema(self.schema))

    def commit(self, end: dict) -> None:
        log.debug("topic %s: committed %s", self.settings.topic, end)


def _rate_limit(cur: dict[str, int], target: dict[str, int], max_rows: int) -> dict[str, int]:
    """At most max_rows records in total, shared in proportion to each partition's lag."""
    lags = {k: target[k] - cur.get(k, target[k]) for k in target}
    total = sum(v for v in lags.values() if v > 0)
    if total <= max_rows:
        return target
    out = dict(cur)
    given = 0
    keys = sorted((k for k in lags if lags[k] > 0), key=_sort_key)
    for k in keys:
        share = lags[k] * max_rows // total
        out[k] = cur[k] + share
        given += share
    for k in keys:  # the rounding remainder, one record each, in key order
        if given >= max_rows:
            break
        if out[k] < target[k]:
            out[k] += 1
            given += 1
    for k in target:
        out.setdefault(k, target[k])
    return out


# ---------------------------------------------------------------- writing

@dataclass
class NsqCommit(WriterCommitMessage):
    partition_id: int
    messages: int
    duplicates: int


def _task_ids(default_batch: str) -> tuple[int, str, str | None]:
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is None:
        return 0, default_batch, None
    batch = ctx.getLocalProperty("streaming.sql.batchId")
    query = ctx.getLocalProperty("sql.streaming.queryId")
    return ctx.partitionId(), batch if batch is not None else default_batch, query


class _WriterBase:
    def __init__(self, options: dict[str, str], schema: StructType, writer_id: str | None
                 ) -> None:
        opts = {str(k).lower(): v for k, v in options.items()}
        self.topic = opts.get("topic")
        if not self.topic:
            raise NsqOptionError("option 'topic' is required")
        self.nsqd = opts.get("nsqd")
        self.lookupd = opts.get("lookupd")
        if not self.nsqd and not self.lookupd:
            raise NsqOptionError("option 'nsqd' or 'lookupd' is required")
        names = {f.name.lower(): f for f in schema.fields}
        if "body" not in names:
            raise NsqOptionError("the DataFrame to write needs a 'body' column (binary or "
                                 f"string); it has {[f.name for f in schema.fields]}")
        for col, ok in (("body", (BinaryType, StringType)), ("key", (BinaryType, StringType)),
                        ("partition", (IntegerType, LongType))):
            if col in names and not isinstance(names[col].dataType, ok):
                raise NsqOptionError(f"column {col!r} has type {names[col].dataType}, "
                                     f"expected one of {[t.__name__ for t in ok]}")
        self.has_key = "key" in names
        self.has_partition = "partition" in names
        self.batch_size = _int(opts, "batchSize", 5000) or 5000
        self.max_batch_bytes = _int(opts, "maxBatchBytes", 4 << 20) or (4 << 20)
        self.secret = opts.get("authsecret") or None
        try:
            self.timeout = float(opts.get("timeout", 30))
        except ValueError:
            raise NsqOptionError("option timeout must be a number") from None
        self.writer_id = opts.get("writerid") or writer_id

    def _publish_all(self, batches: Iterator[pa.RecordBatch], default_batch: str) -> NsqCommit:
        """One write task: every row published once (in chunks of at most ``batchSize``
        messages and ``maxBatchBytes``), each chunk keyed by writer, batch and task so that a
        retried task appends nothing twice."""
        pid, batch_id, query_id = _task_ids(default_batch)
        out = _TaskPublisher(self, self.writer_id or query_id or "anonymous", str(batch_id),
                             pid)
        try:
            for rb in batches:
                out.add_batch(rb)
            out.flush_all()
        finally:
            out.close()
        return NsqCommit(pid, out.sent, out.dups)


def _batch_rows(rb: pa.RecordBatch, has_key: bool
                ) -> tuple[list[bytes], list[bytes | None], np.ndarray]:
    """A record batch's bodies, keys (None without a key column) and each message's size in
    a PUB body; NsqSparkError for a null or empty body."""
    bcol = rb.column("body")
    if not pa.types.is_binary(bcol.type):
        bcol = bcol.cast(pa.binary())
    lens = np.asarray(pc.binary_length(bcol).fill_null(0), dtype=np.int64)
    if bcol.null_count or (lens == 0).any():
        raise NsqSparkError("a message has a null or empty 'body' (NSQ needs at "
                            "least one byte)")
    bodies = bcol.to_pylist()
    sizes = lens + 8
    if has_key:
        kcol = rb.column("key")
        if not pa.types.is_binary(kcol.type):
            kcol = kcol.cast(pa.binary())
        keys = kcol.to_pylist()
        sizes = sizes + np.asarray(pc.binary_length(kcol).fill_null(0), dtype=np.int64)
    else:
        keys = [None] * len(bodies)
    return bodies, keys, sizes


class _TaskPublisher:
    """One write task's publishing: where each partition's rows go (a cluster topic: to the
    partition's leader, a follower refuses them), the chunks pending per partition, and the
    counts the commit message reports."""

    def __init__(self, w: _WriterBase, writer: str, batch_id: str, pid: int) -> None:
        self.w, self.writer, self.batch_id, self.pid = w, writer, batch_id, pid
        self.topic: str = w.topic or ""
        self.seq = self.sent = self.dups = 0
        self.pending: dict[int, tuple[list[bytes], list[bytes | None], int]] = {}
        self.known: list[int] = []  # the topic's partition count, once known
        self.leaders: dict[int, str] | None = None
        found = (cluster_leaders(w.lookupd, w.topic, w.timeout)
                 if w.lookupd and not w.nsqd else None)
        if found is not None:
            self.leaders = wait_leaders(w.lookupd or "", self.topic, w.timeout, found)
            self.known.append(max(1, found[0]))
            nodes = sorted(set(self.leaders.values()))
        else:
            nodes = resolve_nodes(w.nsqd, w.lookupd, w.topic, w.timeout, any_node=True)
        if not nodes:
            raise NsqSparkError(f"no nsqd to publish topic {w.topic!r} to (lookupd "
                                f"{w.lookupd} knows none)")
        self.client = NodeClient(nodes[0], timeout=w.timeout, secret=w.secret)
        self.clients = {nodes[0]: self.client}

    def close(self) -> None:
        for c in self.clients.values():
            c.close()

    def client_for(self, part: int) -> NodeClient:
        if self.leaders is None:
            return self.client
        node = self.leaders.get(part)
        if node is None:
            raise NsqSparkError(f"topic {self.topic!r} has no partition {part} (it has "
                                f"{len(self.leaders)})", "E_BAD_PARTITION")
        if node not in self.clients:
            self.clients[node] = NodeClient(node, timeout=self.w.timeout, secret=self.w.secret)
        return self.clients[node]

    def pub(self, part: int, body: bytes, task: str) -> dict[str, Any]:
        deadline = time.monotonic() + self.w.timeout
        while True:
            try:
                return self.client_for(part).pub(self.topic, body, writer=self.writer,
                                                 batch=self.batch_id, task=task,
                                                 partition=part, keys=self.w.has_key)
            except NsqSparkError as exc:
                if self.leaders is None or not _leader_moved(exc) or \
                        time.monotonic() >= deadline:
                    raise
                # the leader died or moved: the same key again, at the leader lookupd
                # names now (appended at most once: the key travels in the log)
                log.warning("topic %s partition %d: %s; asking lookupd for the leader",
                            self.topic, part, exc)
                time.sleep(0.2)
                self.leaders.update(wait_leaders(self.w.lookupd or "", self.topic,
                                                 self.w.timeout))

    def nparts(self) -> int:
        """The topic's partition count (1 while the topic does not exist yet)."""
        if not self.known:
            try:
                self.known.append(max(1, len(self.client.offsets(self.topic))))
            except NsqSparkError as e:
                if e.status != 404:
                    raise
                self.known.append(1)
        return self.known[0]

    def flush(self, part: int) -> None:
        bodies, keys, _ = self.pending.pop(part, ([], [], 0))
        if not bodies:
            return
        body = encode_pub_body(bodies, keys if self.w.has_key else None)
        r = self.pub(part, body, f"{self.pid}.{self.seq}")
        self.seq += 1
        self.sent += len(bodies)
        self.dups += len(bodies) if r.get("duplicate") else 0

    def flush_all(self) -> None:
        for part in sorted(self.pending):
            self.flush(part)

    def add(self, part: int, bodies: list[bytes], keys: list[bytes | None],
            sizes: np.ndarray) -> None:
        """Queue rows for ``part``, publishing every chunk that is full."""
        batch_size, max_bytes = self.w.batch_size, self.w.max_batch_bytes
        cum = np.cumsum(sizes)
        n = len(bodies)
        i = 0
        while i < n:
            bl, kl, nb = self.pending.get(part) or ([], [], 0)
            room = batch_size - len(bl)
            base = int(cum[i - 1]) if i else 0
            j = int(np.searchsorted(cum, base + max_bytes - nb, "right"))
            j = min(j, i + room, n)
            if j <= i:
                if bl:
                    self.flush(part)
                    continue
                j = i + 1  # one message bigger than maxBatchBytes goes alone
            bl = bl + bodies[i:j]
            kl = kl + keys[i:j]
            self.pending[part] = (bl, kl, nb + int(cum[j - 1]) - base)
            if len(bl) >= batch_size or j < n:
                self.flush(part)
            i = j

    def add_batch(self, rb: pa.RecordBatch) -> None:
        """A record batch's rows, each to its partition: the ``partition`` column, else by
        key as nsqx.client routes (crc32(key) % partitions, a null key: 0), else 0."""
        if rb.num_rows == 0:
            return
        bodies, keys, sizes = _batch_rows(rb, self.w.has_key)
        if self.w.has_partition:
            pcol = np.asarray(rb.column("partition").fill_null(0), dtype=np.int64)
        elif self.w.has_key and self.nparts() > 1:
            n = self.nparts()
            pcol = np.fromiter((zlib.crc32(k) % n if k else 0 for k in keys),
                               dtype=np.int64, count=len(keys))
        else:
            self.add(0, bodies, keys, sizes)
            return
        for part in np.unique(pcol):
            idx = np.flatnonzero(pcol == part)
            self.add(int(part), [bodies[i] for i in idx], [keys[i] for i in idx], sizes[idx])


class NsqBatchWriter(_WriterBase, DataSourceArrowWriter):
    def write(self, iterator: Iterator[pa.RecordBatch]) -> NsqCommit:
        return self._publish_all(iterator, "0")

    def commit(self, messages: list[NsqCommit | None]) -> None:
        n = sum(m.messages for m in messages if m)
        log.info("topic %s: published %d messages (writer %s)", self.topic, n, self.writer_id)

    def abort(self, messages: list[NsqCommit | None]) -> None:
        log.warning("topic %s: write aborted; %d messages were published before", self.topic,
                    sum(m.messages for m in messages if m))


class NsqStreamWriter(_WriterBase, DataSourceStreamArrowWriter):
    def write(self, iterator: Iterator[pa.RecordBatch]) -> NsqCommit:
        return self._publish_all(iterator, "0")

    def commit(self, messages: list[NsqCommit | None], batchId: int) -> None:
        log.debug("topic %s: batch %d published", self.topic, batchId)

    def abort(self, messages: list[NsqCommit | None], batchId: int) -> None:
        log.warning("topic %s: batch %d aborted (a replay is deduplicated)", self.topic, batchId)


# ---------------------------------------------------------------- the data source

class NsqDataSource(DataSource):
    """``spark.read.format("nsq")`` / ``readStream`` / ``write`` / ``writeStream``."""

    @classmethod
    def name(cls) -> str:
        return "nsq"

    def _settings(self) -> Settings:
        return Settings.parse(dict(self.options))

    def schema(self) -> StructType:
        return make_schema(_bool({str(k).lower(): v for k, v in self.options.items()},
                                 "includeHeaders", False))

    def reader(self, schema: StructType) -> NsqBatchReader:
        opts = {str(k).lower(): v for k, v in self.options.items()}
        return NsqBatchReader(self._settings(), opts, schema)

    def streamReader(self, schema: StructType) -> NsqStreamReader:
        opts = {str(k).lower(): v for k, v in self.options.items()}
        for bad in ("endingoffsets", "endingtimestamp"):
            if bad in opts:
                raise NsqOptionError(f"option {bad} is for batch reads only")
        return NsqStreamReader(self._settings(), opts, schema)

    def writer(self, schema: StructType, overwrite: bool) -> NsqBatchWriter:
        return NsqBatchWriter(dict(self.options), schema, f"job-{uuid.uuid4().hex[:16]}")

    def streamWriter(self, schema: StructType, overwrite: bool) -> NsqStreamWriter:
        opts = {str(k).lower(): v for k, v in self.options.items()}
        ckpt = opts.get("checkpointlocation")
        wid = f"ckpt-{zlib.crc32(ckpt.encode()):08x}-{len(ckpt)}" if ckpt else None
        return NsqStreamWriter(dict(self.options), schema, wid)
