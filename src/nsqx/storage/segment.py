"""One log segment: frames file plus its metadata and indexes, all named by the base offset.

Files of segment ``B`` (20-digit zero padded):

* ``B.log``        the frames, back to back (a range of records is one contiguous byte range)
* ``B.batches``    one fixed-size entry per commit (see ``ENTRY``), each with its own crc
* ``B.index``      sparse offset index: (offset, file position) every ``index_interval_bytes``
* ``B.timeindex``  sparse time index: (max timestamp before offset, offset, commit number)
* ``B.headers``    extension headers blobs, referenced from the commit entries
* ``B.sizes``      frame lengths (4B BE each) of mixed-size commits, so a cold read finds frame
                   boundaries without walking the frames (optional: crc-checked, else a scan)

Metadata and indexes are kept apart from the frames so that the frame run stays sendable as is.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import struct
import sys
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Callable
from itertools import accumulate
from pathlib import Path

from nsqx.storage.checksum import crc32
from nsqx.storage.imported_ids import ImportedIds, expected_ids
from nsqx.storage.records import scan_positions

log = logging.getLogger("nsqx.storage.log")

# base, count, position, length, first_ts, max_ts, epoch, commit_id, data_crc,
# headers_pos, headers_len, headers_crc, uniform frame length (0 = mixed),
# frame sizes pos (NO_SIZES = none), frame sizes crc ; + entry crc
ENTRY_BODY = struct.Struct(">QIQQqqIQIQIIIQI")
NO_SIZES = (1 << 64) - 1
ENTRY_SIZE = ENTRY_BODY.size + 4
IDX_BODY = struct.Struct(">QQ")  # offset, position
IDX_SIZE = IDX_BODY.size + 4
TIDX_BODY = struct.Struct(">qQQ")  # max ts before offset, offset, commit number
TIDX_SIZE = TIDX_BODY.size + 4
_U32 = struct.Struct(">I")
_FRAME_HEAD = struct.Struct(">IIqH16s")
SUFFIXES = (".log", ".batches", ".index", ".timeindex", ".headers", ".sizes")
READ_CHUNK = 1 << 20
SCRUB_CHUNK = 4 << 20  # bytes of whole commits read at once by the crc scrub at recovery
LAZY_MAX = 64  # commits whose metadata may wait in memory (their frames are on disk)
_LITTLE = sys.byteorder == "little"


def seg_name(base: int) -> str:
    return f"{base:020d}"


def _with_crc(body: bytes) -> bytes:
    return body + _U32.pack(crc32(body))


def _open(path: Path) -> int:
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)


def write_all(fd: int, bufs: list) -> None:
    """os.writev until every byte is written (writev may write less than asked)."""
    total = sum(map(len, bufs))
    done = os.writev(fd, bufs)
    while done < total:
        rest = memoryview(b"".join(bufs))[done:]
        done += os.write(fd, rest)


def write_one(fd: int, buf: bytes) -> None:
    """os.write of one buffer until all of it is written (the commit fast path's write)."""
    done = os.write(fd, buf)
    if done < len(buf):
        write_all(fd, [memoryview(buf)[done:]])


_open_segments = 0  # segments holding their descriptors now, node-wide (a budget hint)


def open_segments() -> int:
    """How many segments hold their files open now (six descriptors each)."""
    return max(_open_segments, 0)


class Segment:
    """Files and in-memory lookup arrays of one segment (per-commit arrays, sparse indexes)."""

    # the partition's imported range (nsqx import), set by the log: frames there carry the
    # ids it records, which recovery's id checks take instead of nsqx's
    imported: ImportedIds | None = None

    def __init__(self, directory: Path, base: int, partition: int, interval: int,
                 reclaim: Callable[[], object] | None = None) -> None:
        self.dir = directory
        self.base = base
        self.partition = partition
        self.interval = interval
        # called once when opening the files fails for want of descriptors (EMFILE,
        # ENFILE): it closes other idle logs' files, then the open is tried again once
        self.reclaim = reclaim
        stem = directory / seg_name(base)
        self.paths = [stem.with_suffix(s) for s in SUFFIXES]
        # Descriptors are opened on first use and released while the log idles, so
        # thousands of idle topics hold none (an idle topic would otherwise pin six).
        self.fds: list[int] = []
        self.closed = False
        self.sizes: list[int] = []  # each file's size; empty until the first open has them
        self.sizes = [os.fstat(fd).st_size for fd in self.files()]
        self._reset_memory()

    # -- files ---------------------------------------------------------------------------
    def files(self) -> list[int]:
        """The six descriptors (log, batches, index, timeindex, headers, sizes), opened
        again if they were released, each positioned at its end for the next append."""
        if self.fds:
            return self.fds
        if self.closed:
            raise OSError(errno.EBADF, f"segment {self.paths[0]} is closed")
        try:
            fds = self._open_files()
        except OSError as exc:
            if exc.errno not in (errno.EMFILE, errno.ENFILE) or self.reclaim is None:
                raise
            self.reclaim()  # other logs' idle files let go; then one more try
            fds = self._open_files()
        self.fds = fds
        global _open_segments
        _open_segments += 1
        return fds

    def _open_files(self) -> list[int]:
        fds: list[int] = []
        try:
            for p in self.paths:
                fds.append(_open(p))
            if self.sizes:  # reopened: writes continue where they ended
                for fd, size in zip(fds, self.sizes, strict=True):
                    os.lseek(fd, size, os.SEEK_SET)
        except OSError:
            for fd in fds:
                os.close(fd)
            raise
        return fds

    def release_files(self) -> None:
        """Close the descriptors until the next use (nothing is lost: writes are done)."""
        fds, self.fds = self.fds, []
        if fds:
            global _open_segments
            _open_segments -= 1
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)

    @property
    def log_fd(self) -> int:
        return (self.fds or self.files())[0]

    @property
    def meta_fd(self) -> int:
        return (self.fds or self.files())[1]

    @property
    def idx_fd(self) -> int:
        return (self.fds or self.files())[2]

    @property
    def tidx_fd(self) -> int:
        return (self.fds or self.files())[3]

    @property
    def hdr_fd(self) -> int:
        return (self.fds or self.files())[4]

    @property
    def sizes_fd(self) -> int:
        return (self.fds or self.files())[5]

    # -- state --------------------------------------------------------------------------
    def _reset_memory(self) -> None:
        self.bases = array("q")  # first offset of each commit
        self.poss = array("q")  # file position of each commit
        self.runmax = array("q")  # max timestamp up to and including each commit
        self.flens = array("q")  # uniform frame length of each commit (0 = mixed)
        self.spos: list[int] = []  # position of each commit's frame sizes in .sizes
        self.scrc: list[int] = []
        self.sizes_end = 0
        self.idx_off = array("q")
        self.idx_pos = array("q")
        self.tidx_ts = array("q")
        self.tidx_off = array("q")
        self.tidx_bidx = array("q")
        self.next_offset = self.base
        self.log_end = 0  # end of the last commit (== sizes[0] once recovered)
        self.last_commit_id = -1
        self.last_epoch = 0
        self._next_idx_pos = 0
        self._next_tidx_pos = 0
        self.hdr_end = 0
        # metadata of the newest commits, not written yet (see write_single): the entry,
        # offset-index and time-index bytes, in commit order
        self.lazy: list[bytes] = []
        self.lazy_idx: list[bytes] = []
        self.lazy_tidx: list[bytes] = []

    @property
    def size(self) -> int:
        return self.sizes[0]

    @property
    def max_ts(self) -> int:
        return self.runmax[-1] if self.runmax else -(1 << 63)

    @property
    def count(self) -> int:
        return self.next_offset - self.base

    @property
    def next_idx_pos(self) -> int:
        """The log position at or after which the next offset-index entry is due (the log's
        batched writer plans a commit's index entries from it)."""
        return self._next_idx_pos

    def commit_end(self, c: int) -> int:
        return self.poss[c + 1] if c + 1 < len(self.poss) else self.log_end

    def commit_of(self, offset: int) -> int:
        """Index of the commit holding offset (offset must be in this segment)."""

        return bisect_right(self.bases, offset) - 1

    def entry(self, c: int) -> tuple:
        return ENTRY_BODY.unpack_from(self.meta_raw(c, 1))

    def entries(self, first: int = 0):
        n = len(self.bases)
        c = first
        while c < n:
            k = min(n - c, 4096)
            raw = self.meta_raw(c, k)
            for i in range(k):
                yield ENTRY_BODY.unpack_from(raw, i * ENTRY_SIZE)
            c += k

    def meta_raw(self, c: int, k: int) -> bytes:
        """The metadata entries of commits [c, c + k): from the file, then from the entries
        not written yet (``lazy``, always the newest commits)."""
        written = self.sizes[1] // ENTRY_SIZE
        raw = os.pread(self.meta_fd, (min(c + k, written) - c) * ENTRY_SIZE,
                       c * ENTRY_SIZE) if c < written else b""
        if c + k > written and self.lazy:
            lo = max(c - written, 0)
            raw += b"".join(self.lazy[lo : c + k - written])
        return raw

    def write_lazy(self) -> None:
        """Write the metadata of the commits that so far have only their frames on disk
        (one write per file for all of them); a no-op when there are none."""
        if not self.lazy:
            return
        fds = self.files()
        before = self.sizes[1:4]
        try:
            for k, bufs in ((1, self.lazy), (2, self.lazy_idx), (3, self.lazy_tidx)):
                if bufs:
                    data = b"".join(bufs)
                    write_one(fds[k], data)
                    self.sizes[k] += len(data)
        except OSError:  # all or nothing: the entries stay in memory for the next try
            for k, size in enumerate(before, 1):
                with contextlib.suppress(OSError):
                    os.ftruncate(fds[k], size)
                    os.lseek(fds[k], size, os.SEEK_SET)
            self.sizes[1:4] = before
            raise
        self.lazy, self.lazy_idx, self.lazy_tidx = [], [], []

    def settle_lazy(self, epoch: int) -> None:
        """Before a commit of `epoch` by write_single: write the waiting metadata when that
        commit will write its own entry (first of the segment, new epoch) or when
        LAZY_MAX entries wait. Separate from write_single so that its caller's rollback
        sizes are taken after this write."""
        if self.lazy and (epoch != self.last_epoch or len(self.lazy) >= LAZY_MAX):
            self.write_lazy()

    # -- planning a commit (pure) and applying it after the write succeeded -----------------
    def plan_index(self, base: int, pos: int, rel: array | None, flen: int, count: int,
                   target: int) -> tuple[list[tuple[int, int]], int]:
        """Offset-index entry for a commit at file position pos: its first frame starting at or
        after target, at most one per commit (deterministic, so a rebuild writes the same).

        Frames inside a commit are found from the commit's frame length or its .sizes, so
        more entries per commit would only cost per-message work on the append path.
        """
        end = pos + (count * flen if flen else rel[-1])
        if target >= end:
            return [], target
        # first frame starting at or after target: ceil((target-pos)/flen) or a bisect
        k = max(0, -((pos - target) // flen)) if flen else bisect_left(rel, target - pos)
        if k >= count:
            return [], target
        fpos = pos + (k * flen if flen else rel[k])
        return [(base + k, fpos)], fpos + self.interval

    def plan_commit(self, base: int, count: int, length: int, first_ts: int, max_ts: int,
                    epoch: int, commit_id: int, crc: int, hdr: bytes, hdr_pos: int, flen: int,
                    idx: list[tuple[int, int]], next_idx: int, sizes: bytes = b"",
                    sizes_pos: int = NO_SIZES) -> dict:
        pos = self.log_end
        spos = sizes_pos if sizes else NO_SIZES
        scrc = crc32(sizes) if sizes else 0
        entry = _with_crc(ENTRY_BODY.pack(base, count, pos, length, first_ts, max_ts, epoch,
                                          commit_id, crc, hdr_pos, len(hdr),
                                          crc32(hdr) if hdr else 0, flen, spos, scrc))
        tidx = None
        if pos >= self._next_tidx_pos:
            tidx = (self.max_ts, base, len(self.bases))
        return {"base": base, "count": count, "pos": pos, "length": length, "max_ts": max_ts,
                "epoch": epoch, "commit_id": commit_id, "flen": flen, "spos": spos,
                "scrc": scrc,
                "entry": entry, "idx": idx, "next_idx": next_idx, "tidx": tidx}

    def write_single(self, data: bytes, base: int, count: int, ts: int, epoch: int,
                     commit_id: int, flen: int, rel: array | None, sizes: bytes,
                     last_ts: int | None = None, hdr: bytes = b"") -> None:
        """Commit one batch with one write: its frames. Then the memory arrays.

        The fast path of PartitionLog's flush (one PUB or MPUB per loop turn, the common
        case): the same bytes as plan_index + plan_commit + meta_bytes + apply, without the
        plan dict or a snapshot, because memory changes only after every write succeeded
        (on failure the caller truncates the files back to their sizes).

        One write per commit: the metadata entry (and index entries) of a commit in the
        same epoch as the segment's previous one waits in ``lazy`` and is written with up
        to LAZY_MAX others, or before the next general commit, a truncation or close. A
        crash before that leaves frames after the last entry; recovery adopts them by
        checking each frame (length, type, id = partition and offset) and gives them the
        last entry's epoch, which is right because every other commit writes its entry
        *before* its frames: the first of a segment, an epoch change, headers.

        A batch with headers (``hdr``, encoded) is always eager: headers, entry, frames.
        """
        pos = self.log_end
        end = pos + len(data)
        idx, next_idx = self.plan_index(base, pos, rel, flen, count, self._next_idx_pos)
        fs = self.sizes
        spos, scrc = (fs[5], crc32(sizes)) if sizes else (NO_SIZES, 0)
        top = ts if last_ts is None or last_ts < ts else last_ts
        body = ENTRY_BODY.pack(base, count, pos, end - pos, ts, top, epoch, commit_id,
                               crc32(data), fs[4], len(hdr), crc32(hdr) if hdr else 0, flen,
                               spos, scrc)
        max_ts = self.max_ts
        tidx = (max_ts, base, len(self.bases)) if pos >= self._next_tidx_pos else None
        entry = body + _U32.pack(crc32(body))
        if not hdr and self.bases and epoch == self.last_epoch and len(self.lazy) < LAZY_MAX:
            # lazy: the frames are the only write
            write_one(self.log_fd, data)
            fs[0] = end
            if sizes:
                write_one(self.sizes_fd, sizes)
                fs[5] += len(sizes)
            self.lazy.append(entry)
            if idx:
                o, p = idx[0]
                self.lazy_idx.append(_with_crc(IDX_BODY.pack(o, p)))
            if tidx:
                self.lazy_tidx.append(_with_crc(TIDX_BODY.pack(*tidx)))
        else:  # eager: the entry goes first, so recovery never adopts these frames
            self.write_lazy()  # (settle_lazy did it already; a no-op then)
            if hdr:
                write_one(self.hdr_fd, hdr)
                fs[4] += len(hdr)
            write_one(self.meta_fd, entry)
            fs[1] += ENTRY_SIZE
            if sizes:
                write_one(self.sizes_fd, sizes)
                fs[5] += len(sizes)
            write_one(self.log_fd, data)
            fs[0] = end
            if idx:
                o, p = idx[0]
                write_one(self.idx_fd, _with_crc(IDX_BODY.pack(o, p)))
                fs[2] += IDX_SIZE
            if tidx:
                write_one(self.tidx_fd, _with_crc(TIDX_BODY.pack(*tidx)))
                fs[3] += TIDX_SIZE
        # every write done: now the in-memory state (as apply() would)
        self.bases.append(base)
        self.poss.append(pos)
        self.runmax.append(top if top > max_ts else max_ts)
        self.flens.append(flen)
        self.spos.append(spos)
        self.scrc.append(scrc)
        if idx:
            self.idx_off.append(o)
            self.idx_pos.append(p)
        self._next_idx_pos = next_idx
        if tidx:
            self.tidx_ts.append(max_ts)
            self.tidx_off.append(base)
            self.tidx_bidx.append(tidx[2])
            self._next_tidx_pos = pos + self.interval
        self.next_offset = base + count
        self.log_end = end
        self.last_commit_id = commit_id
        self.last_epoch = epoch

    def snapshot(self) -> tuple:
        return (self.log_end, self._next_idx_pos, self._next_tidx_pos, len(self.bases),
                len(self.idx_off), len(self.tidx_ts), self.next_offset, self.last_commit_id,
                self.last_epoch, list(self.sizes))

    def restore(self, snap: tuple) -> None:
        (self.log_end, self._next_idx_pos, self._next_tidx_pos, nb, ni, nt, self.next_offset,
         self.last_commit_id, self.last_epoch, sizes) = snap
        self.sizes = list(sizes)
        del self.bases[nb:], self.poss[nb:], self.runmax[nb:], self.flens[nb:]
        del self.spos[nb:], self.scrc[nb:]
        del self.idx_off[ni:], self.idx_pos[ni:]
        del self.tidx_ts[nt:], self.tidx_off[nt:], self.tidx_bidx[nt:]

    def meta_bytes(self, plan: dict) -> tuple[bytes, bytes, bytes]:
        idx = b"".join(_with_crc(IDX_BODY.pack(o, p)) for o, p in plan["idx"])
        tidx = _with_crc(TIDX_BODY.pack(*plan["tidx"])) if plan["tidx"] else b""
        return plan["entry"], idx, tidx

    def apply(self, plan: dict) -> None:
        self.bases.append(plan["base"])
        self.poss.append(plan["pos"])
        self.runmax.append(max(self.max_ts, plan["max_ts"]))
        self.flens.append(plan["flen"])
        self.spos.append(plan["spos"])
        self.scrc.append(plan["scrc"])
        for o, p in plan["idx"]:
            self.idx_off.append(o)
            self.idx_pos.append(p)
        self._next_idx_pos = plan["next_idx"]
        if plan["tidx"]:
            ts, off, bidx = plan["tidx"]
            self.tidx_ts.append(ts)
            self.tidx_off.append(off)
            self.tidx_bidx.append(bidx)
            self._next_tidx_pos = plan["pos"] + self.interval
        self.next_offset = plan["base"] + plan["count"]
        self.log_end = plan["pos"] + plan["length"]
        self.last_commit_id = plan["commit_id"]
        self.last_epoch = plan["epoch"]

    # -- reads ---------------------------------------------------------------------------
    def position_of(self, offset: int) -> int:
        """File position of the frame at offset: arithmetic for uniform commits, else index+scan."""

        c = self.commit_of(offset)
        base, pos, flen = self.bases[c], self.poss[c], self.flens[c]
        if flen:
            return pos + (offset - base) * flen
        lens = self.frame_sizes(c)
        if lens is not None:
            return pos + sum(lens[: offset - base])
        k = bisect_right(self.idx_off, offset) - 1
        if k >= 0 and self.idx_off[k] >= base:
            base, pos = self.idx_off[k], self.idx_pos[k]
        end = self.commit_end(c)
        while True:
            if base == offset:
                return pos
            data = os.pread(self.log_fd, min(READ_CHUNK, end - pos), pos)
            P = scan_positions(data)
            need = offset - base
            if need < len(P):
                return pos + P[need]
            if len(P) == 1:  # a frame bigger than READ_CHUNK
                (sz,) = _U32.unpack_from(data)
                pos, base = pos + 4 + sz, base + 1
            else:
                pos, base = pos + P[-1], base + len(P) - 1

    def positions_in(self, data: bytes, start_off: int, start_pos: int) -> array:
        """Frame starts (relative to data) of the complete frames of data read at start_pos."""

        out = array("q", [0])
        c = bisect_right(self.bases, start_off) - 1
        k0 = start_off - self.bases[c]  # first frame of the read inside its commit
        rel = 0
        n = len(data)
        ncommits = len(self.bases)
        while c < ncommits and rel < n:
            cend = self.commit_end(c) - start_pos
            lim = min(cend, n)
            flen = self.flens[c]
            lens = None if flen else self.frame_sizes(c)
            if flen:
                k = (lim - rel) // flen
                out.extend(range(rel + flen, rel + k * flen + 1, flen))
                rel += k * flen
            elif lens is not None:
                acc = list(accumulate(lens[k0:], initial=rel))
                cut = bisect_right(acc, lim)
                out.extend(acc[1:cut])
                rel = acc[cut - 1]
            else:
                P = scan_positions(data, rel, lim)
                out.extend(P[1:])
                rel = P[-1]
            if rel < cend:
                break
            c += 1
            k0 = 0
        return out

    def frame_sizes(self, c: int) -> array | None:
        """Frame lengths of mixed commit c from .sizes (None if absent or damaged: scan)."""
        sp = self.spos[c]
        if sp == NO_SIZES:
            return None
        count = (self.bases[c + 1] if c + 1 < len(self.bases) else self.next_offset) - self.bases[c]
        raw = os.pread(self.sizes_fd, 4 * count, sp)
        if len(raw) != 4 * count or crc32(raw) != self.scrc[c]:
            log.warning("%s: frame sizes of commit at offset %d damaged; scanning frames instead",
                        self.paths[5], self.bases[c])
            self.spos[c] = NO_SIZES
            return None
        a = array("I")
        a.frombytes(raw)
        if _LITTLE:
            a.byteswap()
        return a

    def offset_for_time(self, ts: int) -> int | None:
        """First offset whose running-max timestamp >= ts, or None if none in this segment."""
        if not self.runmax or self.runmax[-1] < ts:
            return None
        k = bisect_left(self.tidx_ts, ts) - 1
        lo = self.tidx_bidx[k] if k >= 0 else 0
        c = bisect_left(self.runmax, ts, lo)
        base = self.bases[c]
        pos, end = self.poss[c], self.commit_end(c)
        prev = self.runmax[c - 1] if c else -(1 << 63)
        while pos < end:
            data = os.pread(self.log_fd, min(READ_CHUNK, end - pos), pos)
            P = scan_positions(data)
            if len(P) == 1:
                P = array("q", [0, 4 + _U32.unpack_from(data)[0]])
                data = os.pread(self.log_fd, 16, pos)
            for i in range(len(P) - 1):
                t = struct.unpack_from(">q", data, P[i] + 8)[0]
                if t >= ts or prev >= ts:
                    return base + i
                prev = max(prev, t)
            pos += P[-1]
            base += len(P) - 1
        return self.next_offset  # pragma: no cover - runmax guarantees a hit

    # -- recovery ------------------------------------------------------------------------
    def recover(self, checkpoint: int, scrub: bool = False) -> bool:
        """Load and verify; truncate a torn tail. Returns True if the segment was cut short.

        ``scrub``: also check the CRC of every commit below ``checkpoint`` (fsynced) and cut at
        the first damaged one (``LogConfig.cut_damaged_synced``)."""
        raw = os.pread(self.meta_fd, self.sizes[1], 0) if self.sizes[1] else b""
        n = len(raw) // ENTRY_SIZE
        good = 0
        expect_base, expect_pos = self.base, 0
        parsed = []
        for i in range(n):
            body = raw[i * ENTRY_SIZE : i * ENTRY_SIZE + ENTRY_BODY.size]
            (crc,) = _U32.unpack_from(raw, i * ENTRY_SIZE + ENTRY_BODY.size)
            if crc32(body) != crc:
                break
            e = ENTRY_BODY.unpack(body)
            if e[0] != expect_base or e[2] != expect_pos or e[2] + e[3] > self.sizes[0]:
                break
            if e[9] + e[10] > self.sizes[4]:
                break
            parsed.append(e)
            expect_base, expect_pos = e[0] + e[1], e[2] + e[3]
            good += 1
        corrupt_mid = False
        if good < n:
            # a bad entry followed by a valid one means corruption, not a torn tail
            for i in range(good + 1, n):
                body = raw[i * ENTRY_SIZE : i * ENTRY_SIZE + ENTRY_BODY.size]
                if crc32(body) == _U32.unpack_from(raw, i * ENTRY_SIZE + ENTRY_BODY.size)[0]:
                    corrupt_mid = True
                    break
        missing = self.sizes[1] == 0 and self.sizes[0] > 0
        if missing or corrupt_mid:
            log.warning("%s: batches metadata %s; rebuilding it from the frames (epoch 0, "
                        "extension headers of this segment are lost)", self.paths[1],
                        "missing" if missing else f"corrupt at byte {good * ENTRY_SIZE}")
            return self._rebuild_from_frames()
        cut = False
        if good < n or len(raw) % ENTRY_SIZE:
            log.warning("%s: torn/corrupt batches metadata tail at byte %d; truncating",
                        self.paths[1], good * ENTRY_SIZE)
            cut = True
        # below the recovery point (fsynced): every commit's crc, one pread per run (a scrub
        # for bit rot); past it: crc and frames (torn writes)
        synced = 0
        while synced < len(parsed) and parsed[synced][0] + parsed[synced][1] <= checkpoint:
            synced += 1
        bad = self._first_damaged(parsed, synced) if scrub else None
        verified = True
        if bad is not None:
            e = parsed[bad]
            log.error("%s (partition %d): record batch at offset %d (byte %d, %d records) fails "
                      "its CRC although it was fsynced: damaged on disk; truncating the log "
                      "at offset %d (a cluster replica fetches the rest again from the leader)",
                      self.paths[0], self.partition, e[0], e[2], e[1], e[0])
            parsed = parsed[:bad]
            verified = False
            cut = True
        for i, e in enumerate(parsed):
            if i < synced:
                continue
            if not self._verify(e):
                log.warning("%s: corrupt or torn record batch at byte %d (offset %d); truncating "
                            "log and metadata there", self.paths[0], e[2], e[0])
                parsed = parsed[:i]
                verified = False
                cut = True
                break
        if verified and good == n and parsed and self.sizes[0] > expect_pos:
            parsed += self._adopt_tail(parsed[-1], good)
        self._load(parsed)
        if self.sizes[0] > self.log_end:
            log.warning("%s: torn tail of %d bytes after byte %d (unacknowledged); truncating",
                        self.paths[0], self.sizes[0] - self.log_end, self.log_end)
            cut = True
        self._truncate_files()
        self._load_indexes()
        return cut

    def _first_damaged(self, parsed: list[tuple], n: int) -> int | None:
        """Index of the first of parsed[:n] whose frames fail their crc, None if all pass.

        Commits are contiguous, so they are read in runs of about SCRUB_CHUNK bytes (one
        pread) and each is checked with one crc32 call in C: per commit Python work only.
        """
        if not n:
            return None
        fd = self.log_fd
        stop = parsed[n - 1][2] + parsed[n - 1][3]
        lo = hi = 0
        data = memoryview(b"")
        for k in range(n):
            e = parsed[k]
            pos, end = e[2], e[2] + e[3]
            if end > hi:  # the next run of commits, from this one on
                lo, hi = pos, min(stop, max(end, pos + SCRUB_CHUNK))
                data = memoryview(os.pread(fd, hi - lo, lo))
            if end - lo > len(data) or crc32(data[pos - lo : end - lo]) != e[8]:
                return k
        return None

    def _verify(self, e: tuple) -> bool:
        base, count, pos, length = e[0], e[1], e[2], e[3]
        data = os.pread(self.log_fd, length, pos)
        if len(data) != length or crc32(data) != e[8]:
            return False
        return self._frames_ok(data, base, count)

    def _frames_ok(self, data: bytes, base: int, count: int) -> bool:
        P = scan_positions(data)
        if len(P) - 1 != count or P[-1] != len(data):
            return False
        ids = b"".join([data[p + 18 : p + 34] for p in P[:-1]])
        types_ok = all(data[p + 4 : p + 8] == b"\0\0\0\2" for p in P[:-1])
        return types_ok and ids == expected_ids(self.partition, base, count, self.imported)

    def _load(self, parsed: list[tuple]) -> None:
        self._reset_memory()
        for e in parsed:
            self.bases.append(e[0])
            self.poss.append(e[2])
            self.runmax.append(max(self.max_ts, e[5]))
            self.flens.append(e[12])
            if e[13] != NO_SIZES and e[13] + 4 * e[1] <= self.sizes[5]:
                self.spos.append(e[13])
                self.sizes_end = max(self.sizes_end, e[13] + 4 * e[1])
            else:
                self.spos.append(NO_SIZES)
            self.scrc.append(e[14])
            self.next_offset = e[0] + e[1]
            self.log_end = e[2] + e[3]
            self.last_commit_id = e[7]
            self.last_epoch = e[6]
        self.hdr_end = (parsed[-1][9] + parsed[-1][10]) if parsed else 0

    def _truncate_files(self) -> None:
        want = [self.log_end, len(self.bases) * ENTRY_SIZE, None, None, self.hdr_end,
                self.sizes_end]
        for i, w in enumerate(want):
            if w is not None and self.sizes[i] != w:
                os.ftruncate(self.files()[i], w)
                self.sizes[i] = w
        for fd, s in zip(self.files(), self.sizes, strict=True):
            os.lseek(fd, s, os.SEEK_SET)

    def _adopt_tail(self, last: tuple, kept: int) -> list[tuple]:
        """Entries for the frames after the last entry `last` (commits whose metadata was
        still waiting in memory at a crash, see write_single): every complete frame of
        the right type and id, in runs of up to 1 MiB, in the epoch of `last` (a commit of
        another epoch writes its entry first). Written to the metadata file at once, after
        the `kept` entries (a torn entry after them is dropped)."""
        adopted, _ = self._scan_frames(last[2] + last[3], last[0] + last[1], last[6],
                                       last[7] + 1, last[9] + last[10])
        if adopted:
            os.ftruncate(self.meta_fd, kept * ENTRY_SIZE)
            os.pwrite(self.meta_fd, b"".join(_with_crc(ENTRY_BODY.pack(*e)) for e in adopted),
                      kept * ENTRY_SIZE)
            self.sizes[1] = (kept + len(adopted)) * ENTRY_SIZE
            log.info("%s: adopted %d records written after the last metadata entry",
                     self.paths[0], sum(e[1] for e in adopted))
        return adopted

    def _rebuild_from_frames(self) -> bool:
        """Metadata gone: one commit per run of up to 1 MiB of valid frames, epoch 0."""
        parsed, cut = self._scan_frames(0, self.base, 0, 0)
        if cut:
            log.warning("%s: invalid frame at byte %d while rebuilding metadata; truncating",
                        self.paths[0], (parsed[-1][2] + parsed[-1][3]) if parsed else 0)
        self._load(parsed)
        self.hdr_end = 0
        os.ftruncate(self.meta_fd, 0)
        os.pwrite(self.meta_fd, b"".join(_with_crc(ENTRY_BODY.pack(*e)) for e in parsed), 0)
        self.sizes[1] = len(parsed) * ENTRY_SIZE
        self._truncate_files()
        self._rebuild_indexes()
        return cut

    def _scan_frames(self, pos: int, off: int, epoch: int, commit_id: int, hdr_end: int = 0
                     ) -> tuple[list[tuple], bool]:
        """Entries for the valid frames from file position `pos` (offset `off`) on, one per
        run of up to 1 MiB; and whether an invalid or incomplete frame stopped the scan.
        Recovery only: a check per frame (length, type, id). `hdr_end`: where the headers
        file ends (entries without headers point there, as write_single's do)."""
        parsed = []
        size = self.sizes[0]
        cut = False
        while pos < size:
            data = os.pread(self.log_fd, min(READ_CHUNK, size - pos), pos)
            P = scan_positions(data)
            if len(P) == 1 and len(data) >= 4:
                need = 4 + _U32.unpack_from(data)[0]
                if pos + need <= size:
                    data = os.pread(self.log_fd, need, pos)
                    P = scan_positions(data)
            # keep the longest prefix of frames with the right type and id (recovery only)
            want = expected_ids(self.partition, off, len(P) - 1, self.imported)
            k = 0
            while k < len(P) - 1:
                p = P[k]
                if (data[p + 4 : p + 8] != b"\0\0\0\2" or P[k + 1] - p < 34
                        or data[p + 18 : p + 34] != want[16 * k : 16 * k + 16]):
                    break
                k += 1
            if k == 0:
                cut = True
                break
            chunk = data[: P[k]]
            ts = [struct.unpack_from(">q", chunk, p + 8)[0] for p in P[:k]]
            lens = {P[i + 1] - P[i] for i in range(k)}
            flen = lens.pop() if len(lens) == 1 else 0
            parsed.append((off, k, pos, len(chunk), ts[0], max(ts), epoch, commit_id,
                           crc32(chunk), hdr_end, 0, 0, flen, NO_SIZES, 0))
            commit_id += 1
            pos += len(chunk)
            off += k
        return parsed, cut

    def _load_indexes(self) -> None:
        ok = self._read_index() and self._read_tindex()
        if not ok:
            log.warning("%s: offset/time index missing or corrupt; rebuilding from the log",
                        self.paths[2])
            self._rebuild_indexes()
            return
        # add entries a crash may have kept from being written (commits after the last entry)
        self._fill_indexes()

    def _read_index(self) -> bool:
        raw = os.pread(self.idx_fd, self.sizes[2], 0)
        if len(raw) % IDX_SIZE or (self.sizes[0] and not raw):
            return False
        last = -1
        for i in range(0, len(raw), IDX_SIZE):
            body = raw[i : i + IDX_BODY.size]
            if crc32(body) != _U32.unpack_from(raw, i + IDX_BODY.size)[0]:
                return False
            o, p = IDX_BODY.unpack(body)
            if p <= last or p >= self.log_end or not self.base <= o < self.next_offset:
                if p >= self.log_end and o >= self.next_offset:
                    break  # entries of a truncated tail
                return False
            self.idx_off.append(o)
            self.idx_pos.append(p)
            last = p
        return True

    def _read_tindex(self) -> bool:
        raw = os.pread(self.tidx_fd, self.sizes[3], 0)
        if len(raw) % TIDX_SIZE or (self.sizes[0] and not raw):
            return False
        for i in range(0, len(raw), TIDX_SIZE):
            body = raw[i : i + TIDX_BODY.size]
            if crc32(body) != _U32.unpack_from(raw, i + TIDX_BODY.size)[0]:
                return False
            ts, o, b = TIDX_BODY.unpack(body)
            if b >= len(self.bases):
                break
            if self.bases[b] != o or (self.tidx_bidx and b <= self.tidx_bidx[-1]):
                return False
            self.tidx_ts.append(ts)
            self.tidx_off.append(o)
            self.tidx_bidx.append(b)
        return True

    def _rebuild_indexes(self) -> None:
        for a in (self.idx_off, self.idx_pos, self.tidx_ts, self.tidx_off, self.tidx_bidx):
            del a[:]
        self._fill_indexes()

    def _fill_indexes(self) -> None:
        """(Re)compute index entries after the last kept one and rewrite both index files."""
        self._next_idx_pos = (self.idx_pos[-1] + self.interval) if self.idx_pos else 0
        self._next_tidx_pos = ((self.poss[self.tidx_bidx[-1]] + self.interval)
                               if self.tidx_bidx else 0)
        first_t = (self.tidx_bidx[-1] + 1) if self.tidx_bidx else 0
        # one entry per commit at most: the commit of the last kept entry is complete
        first_c = (self.commit_of(self.idx_off[-1]) + 1) if self.idx_off else 0
        kept = (len(self.idx_off), len(self.tidx_bidx))
        for c in range(min(first_c, first_t), len(self.bases)):
            base, pos, flen = self.bases[c], self.poss[c], self.flens[c]
            count = (self.bases[c + 1] if c + 1 < len(self.bases) else self.next_offset) - base
            end = self.commit_end(c)
            if c >= first_c and end > self._next_idx_pos:
                rel = None
                if not flen:
                    rel = scan_positions(os.pread(self.log_fd, end - pos, pos))
                idx, self._next_idx_pos = self.plan_index(base, pos, rel, flen, count,
                                                          self._next_idx_pos)
                for o, p in idx:
                    self.idx_off.append(o)
                    self.idx_pos.append(p)
            if c >= first_t and pos >= self._next_tidx_pos:
                self.tidx_ts.append(self.runmax[c - 1] if c else -(1 << 63))
                self.tidx_off.append(base)
                self.tidx_bidx.append(c)
                self._next_tidx_pos = pos + self.interval
        if (kept == (len(self.idx_off), len(self.tidx_bidx))
                and self.sizes[2] == kept[0] * IDX_SIZE and self.sizes[3] == kept[1] * TIDX_SIZE):
            return  # the files hold exactly these entries (a clean restart): no rewrite
        idx = b"".join(_with_crc(IDX_BODY.pack(o, p))
                       for o, p in zip(self.idx_off, self.idx_pos, strict=True))
        tidx = b"".join(_with_crc(TIDX_BODY.pack(*t))
                        for t in zip(self.tidx_ts, self.tidx_off, self.tidx_bidx, strict=True))
        for i, data in ((2, idx), (3, tidx)):
            fd = self.files()[i]
            os.ftruncate(fd, 0)
            os.pwrite(fd, data, 0)
            self.sizes[i] = len(data)
            os.lseek(fd, len(data), os.SEEK_SET)

    # -- truncation ----------------------------------------------------------------------
    def truncate_to(self, offset: int) -> None:
        """Drop records >= offset (offset within [base, next_offset])."""
        if offset >= self.next_offset:
            return
        self.write_lazy()  # every entry in the files, which are rewritten below
        c = self.commit_of(offset) if offset > self.base else 0
        entries = list(self.entries(0))[: c + 1] if self.bases else []
        if offset == self.base:
            entries = []
        elif entries and entries[-1][0] < offset:
            e = list(entries[-1])
            cut_pos = self.position_of(offset)
            data = os.pread(self.log_fd, cut_pos - e[2], e[2])
            P = scan_positions(data)
            ts = [struct.unpack_from(">q", data, p + 8)[0] for p in P[:-1]]
            e[1], e[3], e[8] = offset - e[0], len(data), crc32(data)
            e[13], e[14] = NO_SIZES, 0
            e[4], e[5] = ts[0], max(ts)
            entries[-1] = tuple(e)
        else:
            entries = entries[:-1] if entries and entries[-1][0] >= offset else entries
        self._load(entries)
        os.ftruncate(self.meta_fd, 0)
        os.pwrite(self.meta_fd, b"".join(_with_crc(ENTRY_BODY.pack(*e)) for e in entries), 0)
        self.sizes[1] = len(entries) * ENTRY_SIZE
        self._truncate_files()
        keep = bisect_left(self.idx_off, offset)
        del self.idx_off[keep:]
        del self.idx_pos[keep:]
        keep = bisect_left(self.tidx_off, offset)
        del self.tidx_ts[keep:]
        del self.tidx_off[keep:]
        del self.tidx_bidx[keep:]
        self._fill_indexes()

    # -- lifecycle -----------------------------------------------------------------------
    def close(self) -> None:
        self.closed = True
        self.release_files()

    def delete(self) -> None:
        self.close()
        for p in self.paths:
            try:
                p.unlink()
            except FileNotFoundError:
                pass

    def fsync_fds(self) -> list[int]:
        """Dups of the files that must be durable (indexes are rebuilt from them if needed)."""
        fds = (self.log_fd, self.meta_fd, self.hdr_fd) if self.sizes[4] else (self.log_fd, self.meta_fd)
        return [os.dup(fd) for fd in fds]  # an empty .headers (the usual case) needs no fsync


def list_segments(directory: Path) -> list[int]:
    out = []
    for p in directory.glob("*.log"):
        try:
            out.append(int(p.stem))
        except ValueError:
            continue
    return sorted(out)
