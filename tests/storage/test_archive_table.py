"""The archive directory is one table for the usual readers, as it is: pyarrow
(``parquet.read_table``, ``dataset``), pandas and DuckDB (Spark: tests/spark/
test_archive_spark.py). ``topic``, ``date`` and ``partition`` come from the directory names;
files written before the ``partition`` column was dropped are still read by nsqx."""

from __future__ import annotations

from pathlib import Path

import pytest

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

from nsqx.storage.archive import Archive  # noqa: E402
from nsqx.storage.archiver import Archiver  # noqa: E402
from nsqx.storage.log import LogConfig, PartitionLog  # noqa: E402

T0 = 1_700_000_000_000_000_000  # ns: 2023-11-14


def archived(tmp_path: Path, partitions: int = 2) -> tuple[Path, dict[int, list[bytes]]]:
    """An archive of topic ``t`` with ``partitions`` partitions; the bodies archived of each."""
    root = tmp_path / "archive"
    archiver = Archiver(Archive(str(root)), throttle_bytes_per_sec=0)
    want: dict[int, list[bytes]] = {}
    logs = []
    for p in range(partitions):
        lg = PartitionLog(tmp_path / f"p{p}", p, LogConfig(segment_bytes=2048))
        for k in range(0, 120, 6):
            lg.append([b"p%d-%04d" % (p, k + i) for i in range(6)], T0 + k)
            lg.flush()
        lg.sync()
        archiver.add("t", p, lg)
        logs.append(lg)
    while archiver.run_once():
        pass
    for p, lg in enumerate(logs):
        end = lg.closed_segments()[-1][1]
        want[p] = [b"p%d-%04d" % (p, i) for i in range(end)]
    archiver.join()
    for lg in logs:
        lg.close()
    return root, want


def rows_by_partition(parts: list, bodies: list) -> dict[int, list[bytes]]:
    got: dict[int, list[bytes]] = {}
    for p, b in zip(parts, bodies, strict=True):
        got.setdefault(int(p), []).append(bytes(b))
    return got


def test_pyarrow_reads_the_archive_directory(tmp_path: Path) -> None:
    root, want = archived(tmp_path)
    t = pq.read_table(root).sort_by("offset")  # (a dictionary column does not sort)
    assert set(t.column("topic").to_pylist()) == {"t"}
    assert set(t.column("date").to_pylist()) == {"2023-11-14"}
    assert rows_by_partition(t.column("partition").to_pylist(),
                             t.column("body").to_pylist()) == want


def test_pyarrow_dataset_reads_the_archive_directory(tmp_path: Path) -> None:
    ds = pytest.importorskip("pyarrow.dataset")
    root, want = archived(tmp_path)
    t = ds.dataset(root, format="parquet", partitioning="hive").to_table(
        filter=ds.field("partition") == 1, columns=["partition", "offset", "body"])
    t = t.sort_by("offset")
    assert t.column("body").to_pylist() == want[1]


def test_pandas_reads_the_archive_directory(tmp_path: Path) -> None:
    pd = pytest.importorskip("pandas")
    root, want = archived(tmp_path)
    df = pd.read_parquet(root).sort_values(["partition", "offset"])
    assert rows_by_partition(df["partition"].tolist(), df["body"].tolist()) == want
    assert df["timestamp"].min() == pd.Timestamp(T0, unit="ns", tz="UTC")


def test_duckdb_reads_the_archive_directory(tmp_path: Path) -> None:
    duckdb = pytest.importorskip("duckdb")
    root, want = archived(tmp_path)
    rows = duckdb.sql(f"SELECT partition, body FROM read_parquet('{root}/**/*.parquet', "
                      "hive_partitioning = true) WHERE topic = 't' "
                      "ORDER BY partition, \"offset\"").fetchall()
    assert rows_by_partition([r[0] for r in rows], [r[1] for r in rows]) == want


def test_files_with_the_old_partition_column_are_still_read(tmp_path: Path) -> None:
    """An archive written before 2026-11-29 has a ``partition`` column first in every file:
    nsqx reads its frames back as before (by column name)."""
    from tests.storage.test_archive import T0 as T0_LOG
    from tests.storage.test_archive import fill, frames_of, make_log

    archive = Archive(str(tmp_path / "archive"))
    lg = make_log(tmp_path / "log")
    fill(lg)
    end = lg.flushed_offset
    before = frames_of(lg, 0, end)
    archiver = Archiver(archive, throttle_bytes_per_sec=0)
    archiver.add("orders", 3, lg)
    assert archiver.run_once() > 0
    keys = archive.list("orders")
    for key in keys:  # as the old writer made them
        path = archive.path(key)
        t = pq.read_table(path)
        t = t.add_column(0, "partition", pa.array([3] * t.num_rows, pa.int32()))
        pq.write_table(t, path, row_group_size=8192)
    assert lg.apply_retention(end, now=T0_LOG / 1e9 + 10**6) > 0  # local copies gone
    assert frames_of(lg, 0, end) == before
    archiver.join()
    lg.close()
