"""Connection compression negotiated by IDENTIFY, sans-IO and incremental.

* snappy: the snappy *framing* format (golang/snappy NewReader/NewWriter): a stream
  identifier chunk ``\\xff\\x06\\x00\\x00sNaPpY`` then chunks ``[type][3B LE length][data]``;
  compressed (0x00) / uncompressed (0x01) data chunks start with the masked CRC-32C of the
  uncompressed bytes, at most 65536 uncompressed bytes per chunk. Chunk compression and CRC
  checking run in C inside cramjam (its ``snappy.compress``/``decompress`` are this framed
  format); this module walks chunk headers so that limits are enforced *before* buffering
  and output per call is bounded.
* deflate: raw DEFLATE (no zlib header, wbits=-15) with a sync flush after every write so
  the peer can decode each write as soon as it arrives (Go's flate writer ``Flush``).

Decoders return at most ``max_output`` bytes per call (a compression bomb cannot make them
allocate more); when ``pending`` is true, call ``decode(b"")`` again for the rest.
"""

from __future__ import annotations

import zlib

import cramjam

from .errors import ProtocolError

__all__ = [
    "STREAM_IDENTIFIER",
    "CompressionError",
    "DeflateDecoder",
    "DeflateEncoder",
    "SnappyDecoder",
    "SnappyEncoder",
    "crc32c",
    "masked_crc32c",
]

STREAM_IDENTIFIER = b"\xff\x06\x00\x00sNaPpY"
MAX_BLOCK_SIZE = 65536  # max uncompressed bytes per chunk
# golang/snappy: maxEncodedLenOfMaxBlockSize (76490) + checksum (4): no valid chunk is longer
MAX_CHUNK_LEN = 76490 + 4

_snappy_compress = cramjam.snappy.compress
_snappy_decompress = cramjam.snappy.decompress


class CompressionError(ProtocolError):
    """Corrupt or oversize compressed stream (fatal: the connection must close)."""

    def __init__(self, text: str) -> None:
        super().__init__("E_INVALID", text, True)


# --------------------------------------------------------------------------- CRC-32C


def _make_table() -> list[int]:
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_CRC_TABLE = _make_table()


def crc32c(data: bytes, crc: int = 0) -> int:
    """Castagnoli CRC (table-driven, pure Python: a reference, not used on the hot path)."""
    crc ^= 0xFFFFFFFF
    table = _CRC_TABLE
    for b in data:
        crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc32c(data: bytes) -> int:
    """The snappy framing format's masked checksum."""
    c = crc32c(data)
    return ((((c >> 15) | (c << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


# --------------------------------------------------------------------------- snappy


class SnappyEncoder:
    """``encode(data)`` -> framed bytes; the stream identifier precedes the first chunk."""

    def __init__(self) -> None:
        self._started = False

    def encode(self, data: bytes) -> bytes:
        if not data:
            return b""
        out = bytes(_snappy_compress(data))
        if self._started:
            return out[len(STREAM_IDENTIFIER) :]
        self._started = True
        return out


def _uvarint(buf: bytearray, pos: int, end: int) -> int:
    """Snappy block header: decoded length (little-endian base-128); -1 if malformed."""
    result = 0
    shift = 0
    while pos < end and shift < 35:
        b = buf[pos]
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result
        pos += 1
        shift += 7
    return -1


class SnappyDecoder:
    """Incremental framed-snappy decoder: ``decode(data)`` -> decompressed bytes."""

    def __init__(self, max_output: int = 1 << 20) -> None:
        self.max_output = max(max_output, MAX_BLOCK_SIZE)
        self._buf = bytearray()
        self._seen_identifier = False
        self._need = 4
        self._pending = False

    @property
    def pending(self) -> bool:
        """More output is available without new input (call ``decode(b"")``)."""
        return self._pending

    @property
    def buffered(self) -> int:
        return len(self._buf)

    def decode(self, data: bytes) -> bytes:
        buf = self._buf
        buf += data
        if len(buf) < self._need and not self._pending:
            return b""
        end = len(buf)
        pos = 0
        produced = 0
        self._pending = False
        self._need = 4
        while end - pos >= 4:
            ctype = buf[pos]
            clen = buf[pos + 1] | buf[pos + 2] << 8 | buf[pos + 3] << 16
            if clen > MAX_CHUNK_LEN:
                raise CompressionError(f"snappy: chunk too large ({clen} bytes)")
            if not self._seen_identifier and ctype != 0xFF:
                raise CompressionError("snappy: stream does not start with the stream identifier")
            if ctype == 0xFF:
                if clen != 6:
                    raise CompressionError("snappy: corrupt stream identifier")
            elif ctype <= 0x01:
                if clen < 4:
                    raise CompressionError("snappy: corrupt input (short chunk)")
                if ctype == 0x01 and clen - 4 > MAX_BLOCK_SIZE:
                    raise CompressionError("snappy: corrupt input (uncompressed chunk too large)")
            elif ctype <= 0x7F:
                raise CompressionError(f"snappy: unsupported chunk type 0x{ctype:02x}")
            if end - pos - 4 < clen:
                self._need = 4 + clen
                break
            if ctype == 0xFF:
                if buf[pos + 4 : pos + 10] != b"sNaPpY":
                    raise CompressionError("snappy: corrupt stream identifier")
                self._seen_identifier = True
            elif ctype <= 0x01:
                if ctype == 0x00:
                    n = _uvarint(buf, pos + 8, pos + 4 + clen)
                    if n < 0 or n > MAX_BLOCK_SIZE:
                        raise CompressionError("snappy: corrupt input (bad block length)")
                else:
                    n = clen - 4
                if produced and produced + n > self.max_output:
                    self._pending = True
                    break
                produced += n
            pos += 4 + clen
        if not pos:
            return b""
        region = bytes(memoryview(buf)[:pos])
        del buf[:pos]
        if not produced:
            return b""
        try:
            # one C call checks every CRC and decompresses every chunk of the region
            return bytes(_snappy_decompress(STREAM_IDENTIFIER + region))
        except Exception as e:  # cramjam.DecompressionError
            raise CompressionError(f"snappy: corrupt input ({e})") from None


# --------------------------------------------------------------------------- deflate


class DeflateEncoder:
    """Raw DEFLATE; every ``encode`` ends with a sync flush (decodable at once)."""

    def __init__(self, level: int = 6) -> None:
        self._c = zlib.compressobj(level, zlib.DEFLATED, -15)

    def encode(self, data: bytes) -> bytes:
        c = self._c
        return c.compress(data) + c.flush(zlib.Z_SYNC_FLUSH)


class DeflateDecoder:
    """Incremental raw DEFLATE decoder with bounded output per call."""

    def __init__(self, max_output: int = 1 << 20) -> None:
        self.max_output = max_output
        self._d = zlib.decompressobj(-15)
        self._tail = b""
        self._pending = False

    @property
    def pending(self) -> bool:
        """More output may be available without new input (call ``decode(b"")``)."""
        return self._pending

    def decode(self, data: bytes) -> bytes:
        d = self._d
        if d.eof:
            if data:
                raise CompressionError("deflate: data after end of stream")
            return b""
        if self._tail:
            data = self._tail + data
        try:
            out = d.decompress(data, self.max_output)
        except zlib.error as e:
            raise CompressionError(f"deflate: {e}") from None
        self._tail = d.unconsumed_tail
        if d.eof and d.unused_data:
            raise CompressionError("deflate: data after end of stream")
        self._pending = bool(self._tail) or (len(out) >= self.max_output and not d.eof)
        return out
