"""Disk full / unwritable: LogError, earlier data intact, writes work again afterwards."""

import errno
import os

import pytest

from nsqx.storage.log import LogConfig, LogError, PartitionLog


def frames(lg):
    return [lg.read_frame(i) for i in range(lg.start_offset, lg.flushed_offset)]


@pytest.fixture(params=["fast", "general"], autouse=True)
def commit_path(request, monkeypatch):
    """Every test runs with the one-batch fast commit and with the general commit."""
    monkeypatch.setattr(PartitionLog, "_fast_commit", request.param == "fast")
    return request.param


def patch_file_writes(monkeypatch, fail):
    """Route os.write and os.writev through fail(n) (n = 1-based call count); undo()."""
    real_write, real_writev = os.write, os.writev
    calls = {"n": 0}

    def write(fd, data):
        calls["n"] += 1
        fail(calls["n"])
        return real_write(fd, data)

    def writev(fd, bufs):
        calls["n"] += 1
        fail(calls["n"])
        return real_writev(fd, bufs)

    monkeypatch.setattr(os, "write", write)
    monkeypatch.setattr(os, "writev", writev)

    def undo():
        monkeypatch.setattr(os, "write", real_write)
        monkeypatch.setattr(os, "writev", real_writev)
    return undo


@pytest.mark.parametrize("code, words", [(errno.ENOSPC, "disk full"), (errno.EIO, "I/O error"),
                                         (errno.EROFS, "not writable")])
def test_write_error_rolls_back(tmp_path, monkeypatch, commit_path, code, words):
    lg = PartitionLog(tmp_path, 0, LogConfig(segment_bytes=1 << 20))
    lg.append([b"a", b"bb"], 1)
    lg.flush()
    before = frames(lg)
    sizes = [s.sizes[:] for s in lg._segments]
    # the fast path's commit is one write (its frames; the entry waits in memory); the
    # general path writes the entry, then the frames: fail the frames after the entry
    fail_at = 1 if commit_path == "fast" else 2

    def failing(n):
        if n == fail_at:
            raise OSError(code, os.strerror(code))

    undo = patch_file_writes(monkeypatch, failing)
    lg.append([b"c"] * 10, 2)
    with pytest.raises(LogError, match=words):
        lg.flush()
    undo()
    assert lg.next_offset == lg.flushed_offset == 2
    assert frames(lg) == before
    assert [s.sizes for s in lg._segments] == sizes
    assert [os.fstat(fd).st_size for fd in lg._segments[0].fds] == sizes[0]
    # space is back
    assert lg.append([b"d"], 3) == 2
    lg.flush()
    lg.close()
    lg = PartitionLog(tmp_path, 0, LogConfig(segment_bytes=1 << 20))
    assert lg.next_offset == 3
    assert lg.read_frame(2).endswith(b"0000000000000002d")
    lg.close()


def test_error_on_first_write_and_segment_roll(tmp_path, monkeypatch):
    cfg = LogConfig(segment_bytes=200)
    lg = PartitionLog(tmp_path, 0, cfg)
    lg.append([b"x" * 150], 1)
    lg.flush()

    def enospc(n):
        raise OSError(errno.ENOSPC, "No space left on device")

    undo = patch_file_writes(monkeypatch, enospc)
    lg.append([b"y" * 150], 2)  # needs a new segment
    with pytest.raises(LogError, match="disk full"):
        lg.flush()
    assert len(lg._segments) == 1
    assert sorted(p.name for p in tmp_path.iterdir() if p.suffix == ".log") == [
        "00000000000000000000.log"]
    undo()
    lg.append([b"z" * 150], 3)
    lg.flush()
    assert len(lg._segments) == 2 and lg.read_frame(1).endswith(b"z" * 150)
    lg.close()


def test_unwritable_segment_creation(tmp_path, monkeypatch):
    lg = PartitionLog(tmp_path, 0, LogConfig(segment_bytes=100))
    lg.append([b"x" * 80], 1)
    lg.flush()
    real = os.open

    def rofs(path, flags, *a, **kw):
        if str(path).endswith(".log") and flags & os.O_CREAT:
            raise OSError(errno.EROFS, "Read-only file system")
        return real(path, flags, *a, **kw)

    monkeypatch.setattr(os, "open", rofs)
    lg.append([b"y" * 80], 2)
    with pytest.raises(LogError, match="not writable"):
        lg.flush()
    monkeypatch.setattr(os, "open", real)
    lg.append([b"y" * 80], 2)
    lg.flush()
    assert lg.next_offset == 2
    lg.close()


def test_fsync_error(tmp_path, monkeypatch):
    lg = PartitionLog(tmp_path, 0)
    lg.append([b"x"], 1)
    lg.flush()

    def eio(fd):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "fdatasync", eio)
    with pytest.raises(LogError, match="I/O error"):
        lg.sync()
    assert lg.synced_offset == 0
    monkeypatch.undo()
    lg.sync()
    assert lg.synced_offset == 1
    lg.close()


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores directory permissions")
def test_read_only_directory(tmp_path):
    d = tmp_path / "ro"
    lg = PartitionLog(d, 0, LogConfig(segment_bytes=100))
    lg.close()
    os.chmod(d, 0o555)
    for p in d.iterdir():
        os.chmod(p, 0o444)
    try:
        with pytest.raises(LogError, match="not writable"):
            PartitionLog(d, 0)
    finally:
        os.chmod(d, 0o755)


def test_unwritable_path(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_bytes(b"")
    with pytest.raises(LogError):
        PartitionLog(blocker / "log", 0)


@pytest.mark.parametrize("err", [errno.EMFILE, errno.ENFILE, errno.EACCES])
def test_out_of_descriptors_reclaims_once_then_retries(tmp_path, monkeypatch, err):
    """A segment whose files cannot be opened for want of descriptors calls the log's
    reclaim_files once and tries again once; other errors are not retried."""
    from nsqx.storage import segment

    lg = PartitionLog(tmp_path / "p0", config=LogConfig(reclaim_files=lambda: calls.append(1)))
    lg.append([b"a"])
    lg.flush()
    lg.sync()
    assert lg.release_files()
    calls: list[int] = []
    real, fails = segment._open, {"n": 1}

    def open_(path):
        if fails["n"]:
            fails["n"] -= 1
            raise OSError(err, os.strerror(err), str(path))
        return real(path)

    monkeypatch.setattr(segment, "_open", open_)
    if err == errno.EACCES:
        with pytest.raises(LogError):
            lg.append([b"b"])
            lg.flush()
        assert calls == []
    else:
        lg.append([b"b"])
        lg.flush()
        assert calls == [1] and frames(lg)[-1].endswith(b"b")
        assert lg.release_files() is False  # written, not synced
        fails["n"] = 2  # fails again after the reclaim: the error is raised
        lg.sync()
        assert lg.release_files()
        lg._drop_caches()  # a read from disk
        with pytest.raises(LogError, match=os.strerror(err)):
            lg.read_frame(0)
        assert calls == [1, 1]
    lg.close()
