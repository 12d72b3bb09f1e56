"""nsqd TCP protocol V2, sans-IO: a command parser for the server, encoders for clients.

Texts and validation order follow upstream ``nsqd/protocol_v2.go`` and ``client_v2.go``.
The parser does what framing needs (line split, body commands' params, sizes) and checks
sizes *before* buffering a body. Checks that depend on server state or options (client
state, RDY/REQ ranges, IDENTIFY fields) are pure helpers below that the server calls when
it executes a command, in upstream order.
"""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from functools import lru_cache
from typing import Any

import orjson

from nsqx.speedups import native

from .errors import ProtocolError, go_quote, raw_text
from .names import valid_channel_name, valid_topic_name

__all__ = [
    "ASK_REPLAYED_KEY",
    "BODY_COMMANDS",
    "DEFER_KEY",
    "DISPATCH_TAG_KEY",
    "MPUB_LIKE",
    "PUB_LIKE",
    "TRACE_ID_KEY",
    "TRACE_TOPIC",
    "ext_json",
    "mpub_ext",
    "mpub_trace",
    "parse_ext_json",
    "parse_traced_response",
    "pub_ext",
    "pub_trace",
    "split_ext",
    "split_trace",
    "traced_response",
    "valid_tag",
    "COMMANDS",
    "FIN_BATCH",
    "MAGIC_V2",
    "Command",
    "CommandParser",
    "IdentifyLimits",
    "IdentifySettings",
    "auth",
    "base10",
    "cannot_in_state",
    "cls",
    "dpub",
    "fin",
    "fin_failed",
    "identify",
    "identify_response",
    "mpub",
    "nop",
    "parse_dpub_timeout",
    "parse_fin",
    "parse_identify",
    "parse_lone_marked_pub",
    "parse_lone_pub",
    "parse_partition",
    "parse_rdy",
    "parse_req",
    "parse_start_position",
    "parse_sub",
    "parse_sub_advanced",
    "parse_touch",
    "pub",
    "rdy",
    "req",
    "req_failed",
    "split_marked",
    "split_mpub",
    "strip_no_ext",
    "StartKind",
    "StartPosition",
    "sub",
    "sub_advanced",
    "tls_required",
    "touch",
    "touch_failed",
    "validate_message_id",
]

MAGIC_V2 = b"  V2"

# Name of the synthetic command a parser built with batch_fin=True emits for a run of two
# or more well-formed consecutive ``FIN <16-byte id>`` lines; params = the ids, in order.
# It can never come from the wire ("FIN*" is not a valid command there).
FIN_BATCH = b"FIN*"

LINE_COMMANDS = frozenset({b"SUB", b"SUB_ADVANCED", b"SUB_ORDERED", b"RDY", b"FIN", b"REQ", b"TOUCH", b"CLS",
                           b"NOP"})
# Youzan's publish variants: a JSON header (EXT) or an 8-byte trace id (TRACE) per message
PUB_LIKE = frozenset({b"PUB", b"PUB_EXT", b"PUB_TRACE"})
MPUB_LIKE = frozenset({b"MPUB", b"MPUB_EXT", b"MPUB_TRACE"})
BODY_COMMANDS = frozenset({b"IDENTIFY", b"AUTH", b"DPUB"}) | PUB_LIKE | MPUB_LIKE
COMMANDS = LINE_COMMANDS | BODY_COMMANDS

MSG_ID_LENGTH = 16

_I32 = struct.Struct(">i")
_I32_unpack_from = _I32.unpack_from
_U32 = struct.Struct(">I")
_TWO_I32 = struct.Struct(">ii")
_MASK64 = (1 << 64) - 1

# a run of well-formed FIN lines (ids never contain space, CR or LF) and the ids in it
_FIN_RUN = re.compile(rb"(?:FIN [^ \r\n]{16}\r?\n)+")
_FIN_ID = re.compile(rb"FIN ([^ \r\n]{16})\r?\n")
_FIN_LINE = 21  # b"FIN " + 16-byte id + b"\n"


def _fin_lines(buf: bytes, pos: int) -> list[bytes] | None:
    """The ids when everything from ``pos`` to the last LF of ``buf`` is FIN lines of
    exactly ``FIN <16 bytes>\\n`` (a consumer's usual read), else None.

    The same ids as ``_FIN_RUN``/``_FIN_ID`` there, cut by C calls (split, count) instead
    of two regex passes: the regexes cost ~3,000 instructions per FIN, half of all nsqd
    does per drained message (bench/drain_instructions.py)."""
    last = buf.rfind(b"\n", pos)
    k, rest = divmod(last + 1 - pos, _FIN_LINE)
    if k < 2 or rest:
        return None
    run = buf[pos : last + 1]
    # k lines of 21 bytes split into k parts of 16 by "\nFIN ": every LF and every space
    # is a separator's, so no id holds one, and no CR anywhere
    ids = run[4:-1].split(b"\nFIN ")
    if (len(ids) != k or run.count(b"\n") != k or run.count(b" ") != k or b"\r" in run
            or set(map(len, ids)) != {16}):
        return None
    return ids


class Command:
    """One client command. ``params`` are the arguments after the name (bytes, unparsed).

    ``body`` is set for IDENTIFY/AUTH/PUB/DPUB, ``bodies`` (list of message bodies) for MPUB.
    ``stripped``: an ``MPUB_EXT`` cut by :func:`split_marked` (an idempotent producer's
    batch): ``bodies[0]`` is the first message as sent, ``bodies[1:]`` the others' bodies
    (they had no header: their 2-byte JSON length is gone).
    """

    __slots__ = ("name", "params", "body", "bodies", "stripped")

    def __init__(
        self,
        name: bytes,
        params: list[bytes],
        body: bytes | None = None,
        bodies: list[bytes] | None = None,
        stripped: bool = False,
    ) -> None:
        self.name = name
        self.params = params
        self.body = body
        self.bodies = bodies
        self.stripped = stripped

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Command):
            return NotImplemented
        return (self.name, self.params, self.body, self.bodies, self.stripped) == (
            other.name, other.params, other.body, other.bodies, other.stripped)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        extra = ""
        if self.body is not None:
            extra = f", body=<{len(self.body)} bytes>"
        if self.bodies is not None:
            extra += f", bodies=<{len(self.bodies)} messages>"
        return f"Command({self.name!r}, {self.params!r}{extra})"


# --------------------------------------------------------------------------- numbers


def base10(b: bytes) -> int | None:
    """Upstream ``protocol.ByteToBase10``: ASCII digits only, ``b""`` is 0, wraps at 2**64.

    Returns None where upstream returns an error.
    """
    if not b:
        return 0
    if not b.isdigit():  # bytes.isdigit is ASCII-only
        return None
    return int(b) & _MASK64


def _to_int64(n: int) -> int:
    n &= _MASK64
    return n - (1 << 64) if n >= 1 << 63 else n


# --------------------------------------------------------------------------- parser


Precheck = Callable[[bytes, list[bytes]], None]


class CommandParser:
    """Incremental V2 command parser (after the 4-byte magic): ``feed(bytes) -> [Command]``.

    * A line longer than ``max_line`` bytes including its ``\\n`` (upstream's 16 KiB bufio
      buffer) is a fatal ``E_INVALID``; an unknown command is fatal
      ``E_INVALID invalid command <NAME>``.
    * Body sizes are validated as soon as the size field arrives; nothing bigger than
      ``max_line + 8 + max(max_body_size, max_msg_size)`` is ever buffered.
    * ``feed()`` stops right after an IDENTIFY or AUTH command (always last in the returned
      list): the stream may switch to TLS/snappy/deflate after IDENTIFY, and later commands
      may depend on AUTH. Take the raw leftover with ``take_buffered()`` (to decompress it)
      or call ``feed(b"")`` to continue.
    * On an error ``feed()`` raises ProtocolError whose ``commands`` are the commands
      completed before it in this call (execute them first); later feeds raise it again.
    * ``precheck(name, params)``, if given, is called for each body command and unknown
      command right after its line is split, before validation and before its body is
      buffered; raising ProtocolError there aborts as above. Use it for upstream's earlier
      checks (TLS required, client state, MPUB auth). It may run before commands earlier in
      the same feed are executed, so the server must repeat state checks on execution.
    * ``max_req_timeout_ms``, if given, makes DPUB's range check happen before its body.
    * ``batch_fin=True`` emits runs of FIN lines as one ``Command(FIN_BATCH, ids)``.
    * ``strip_marked=True`` cuts an ``MPUB_EXT`` whose messages after the first have no
      header with :func:`split_marked`: ``Command.stripped``, the others' bodies without
      their JSON length (nsqd's batched idempotent ingest); otherwise ``bodies`` are the
      messages as sent.
    """

    def __init__(
        self,
        max_body_size: int = 5 * 1024 * 1024,
        max_msg_size: int = 1024 * 1024,
        max_line: int = 16384,
        *,
        batch_fin: bool = False,
        strip_marked: bool = False,
        max_req_timeout_ms: int | None = None,
        precheck: Precheck | None = None,
    ) -> None:
        self.max_body_size = max_body_size
        self.max_msg_size = max_msg_size
        self.max_line = max_line
        # the FIN fast path skips the line-length check: only valid when a FIN line fits
        self.batch_fin = batch_fin and max_line > 22
        self.strip_marked = strip_marked
        self.max_req_timeout_ms = max_req_timeout_ms
        self.precheck = precheck
        # Held bytes as a list of chunks, joined once when a command completes (a 200 KB
        # MPUB arriving in 64 KB reads is copied once, not once per read plus once more).
        self._chunks: list[bytes | memoryview] = []
        self._held = 0
        self._need = 1  # do not parse again before the buffer holds this many bytes
        self._prechecked = False  # precheck already ran for the command at buffer start
        self._await_line = False  # the buffer is an incomplete line (no \n in it)
        self.error: ProtocolError | None = None

    @property
    def buffered(self) -> int:
        """Bytes held (one incomplete command, or the leftover after IDENTIFY/AUTH)."""
        return self._held

    def take_buffered(self) -> bytes:
        """Remove and return raw unparsed bytes (e.g. to decompress them after an upgrade)."""
        data = b"".join(self._chunks)
        self._chunks, self._held = [], 0
        self._need = 1
        self._prechecked = False
        self._await_line = False
        return data

    def idle(self) -> bool:
        """No bytes held and no error: the next feed() starts at a command boundary."""
        return not self._held and self.error is None

    def feed(self, data: bytes) -> list[Command]:
        if self.error is not None:
            raise self.error
        if self._held:
            if data:
                self._chunks.append(data if type(data) is bytes else bytes(data))
                self._held += len(data)
            if self._held < self._need:
                return []
            if self._await_line and b"\n" not in data:
                # still inside one line: O(new bytes), no rescan or copy of the buffer
                if self._held >= self.max_line:
                    self.error = _line_too_long(self.max_line)
                    self._chunks, self._held = [], 0
                    raise self.error
                return []
            buf = b"".join(self._chunks)
            self._chunks, self._held = [], 0
        elif not data:
            return []
        else:
            buf = data if type(data) is bytes else bytes(data)
        out: list[Command] = []
        self._await_line = False
        try:
            pos = self._parse(buf, out)
        except ProtocolError as e:
            self.error = e
            self._chunks, self._held = [], 0
            e.commands = out
            raise
        if pos < len(buf):
            self._chunks.append(memoryview(buf)[pos:])
            self._held = len(buf) - pos
        return out

    def _parse(self, buf: bytes, out: list[Command]) -> int:
        """Parse complete commands from ``buf``; return the offset of the first unparsed byte."""
        pos = 0
        end = len(buf)
        max_line = self.max_line
        find = buf.find
        append = out.append
        batch_fin = self.batch_fin
        whole_try = batch_fin
        while pos < end:
            if batch_fin and buf.startswith(b"FIN ", pos):
                if whole_try:  # once per read: a failed try costs a copy of the rest
                    whole_try = False
                    ids = _fin_lines(buf, pos)
                    if ids is not None:
                        append(Command(FIN_BATCH, ids))
                        pos += len(ids) * _FIN_LINE  # k whole lines, as checked
                        continue
                m = _FIN_RUN.match(buf, pos)
                if m is not None:
                    ids = _FIN_ID.findall(buf, pos, m.end())
                    if len(ids) == 1:
                        append(Command(b"FIN", ids))
                    else:
                        append(Command(FIN_BATCH, ids))
                    pos = m.end()
                    continue
            nl = find(b"\n", pos)
            if nl < 0:
                if end - pos >= max_line:
                    raise _line_too_long(max_line)
                self._need = end - pos + 1
                self._await_line = True
                return pos
            if nl - pos >= max_line:
                raise _line_too_long(max_line)
            if nl > pos and buf[nl - 1] == 13:  # strip one trailing \r
                params = buf[pos : nl - 1].split(b" ")
            else:
                params = buf[pos:nl].split(b" ")
            name = params[0]
            if name in LINE_COMMANDS:
                del params[0]
                append(Command(name, params))
                pos = nl + 1
                continue
            del params[0]
            if self.precheck is not None and not self._prechecked:
                self.precheck(name, params)
                self._prechecked = True
            if name not in BODY_COMMANDS:
                raise ProtocolError("E_INVALID", f"invalid command {raw_text(name)}")
            res = self._body_command(buf, pos, nl + 1, name, params)
            if res is None:
                return pos
            cmd, pos = res
            self._prechecked = False
            append(cmd)
            if name == b"IDENTIFY" or name == b"AUTH":
                self._need = 1
                return pos
        self._need = 1
        return pos

    def _body_command(
        self, buf: bytes, start: int, p: int, name: bytes, params: list[bytes]
    ) -> tuple[Command, int] | None:
        """Validate a body command whose line ends at ``p``; None = wait for more bytes."""
        end = len(buf)
        if name in PUB_LIKE or name == b"DPUB":
            cmd_s = name.decode()
            if name != b"DPUB":
                if len(params) < 1:
                    raise ProtocolError("E_INVALID", "PUB insufficient number of parameters")
            elif len(params) < 2:
                raise ProtocolError("E_INVALID", "DPUB insufficient number of parameters")
            if not valid_topic_name(params[0]):
                raise ProtocolError(
                    "E_BAD_TOPIC", f"{cmd_s} topic name {go_quote(params[0])} is not valid")
            if name == b"DPUB":
                _dpub_timeout(params[1], self.max_req_timeout_ms)
            if end - p < 4:
                return self._need_more(start, p, 4)
            size = _I32_unpack_from(buf, p)[0]
            if size <= 0:
                raise ProtocolError("E_BAD_MESSAGE", f"{cmd_s} invalid message body size {size}")
            if size > self.max_msg_size:
                raise ProtocolError(
                    "E_BAD_MESSAGE", f"{cmd_s} message too big {size} > {self.max_msg_size}")
            if end - p - 4 < size:
                return self._need_more(start, p, 4 + size)
            return Command(name, params, buf[p + 4 : p + 4 + size]), p + 4 + size
        if name in MPUB_LIKE:
            cmd_s = name.decode()
            if len(params) < 1:
                raise ProtocolError("E_INVALID", f"{cmd_s} insufficient number of parameters")
            if not valid_topic_name(params[0]):
                # upstream quirk: the code is repeated inside the text
                raise ProtocolError(
                    "E_BAD_TOPIC", f"E_BAD_TOPIC {cmd_s} topic name {go_quote(params[0])} is not valid")
            if end - p < 4:
                return self._need_more(start, p, 4)
            size = _I32_unpack_from(buf, p)[0]
            if size <= 0:
                raise ProtocolError("E_BAD_BODY", f"{cmd_s} invalid body size {size}")
            if size > self.max_body_size:
                raise ProtocolError(
                    "E_BAD_BODY", f"{cmd_s} body too big {size} > {self.max_body_size}")
            if size >= 4:
                if end - p < 8:
                    return self._need_more(start, p, 8)
                _check_mpub_count(_I32_unpack_from(buf, p + 4)[0], self.max_body_size)
            if end - p - 4 < size:
                return self._need_more(start, p, 4 + size)
            # a view: the split copies each body straight out of the read buffer
            body = memoryview(buf)[p + 4 : p + 4 + size]
            if name == b"MPUB_EXT" and self.strip_marked:  # an idempotent producer's batch:
                # cut once (split_marked)
                marked = split_marked(body, self.max_msg_size)
                if marked is not None:
                    return Command(name, params, None, marked, True), p + 4 + size
            return Command(name, params, None, split_mpub(body, self.max_msg_size, self.max_body_size)), p + 4 + size
        # IDENTIFY / AUTH: upstream checks "too big" before "<= 0" here
        if name == b"AUTH" and len(params) != 0:
            raise ProtocolError("E_INVALID", "AUTH invalid number of parameters")
        cmd_s = name.decode()
        if end - p < 4:
            return self._need_more(start, p, 4)
        size = _I32_unpack_from(buf, p)[0]
        if size > self.max_body_size:
            raise ProtocolError(
                "E_BAD_BODY", f"{cmd_s} body too big {size} > {self.max_body_size}")
        if size <= 0:
            raise ProtocolError("E_BAD_BODY", f"{cmd_s} invalid body size {size}")
        if end - p - 4 < size:
            return self._need_more(start, p, 4 + size)
        return Command(name, params, buf[p + 4 : p + 4 + size]), p + 4 + size

    def _need_more(self, start: int, p: int, n: int) -> None:
        # the parse resumes at the command's line start, so count from there
        self._need = p + n - start
        return None


def parse_lone_pub(data: bytes, max_msg_size: int) -> tuple[bytes, bytes] | None:
    """(topic, body) when ``data`` is exactly one well-formed PUB, else None.

    Speed: a producer waiting for each OK sends one PUB per read; recognising that read
    whole skips the general parser, its Command object and the command queue (several
    microseconds of a ~30 us path). Anything unusual (a bad name, a \\r, a size out of
    bounds, a partial or a second command) returns None and takes the general path,
    which produces the errors; tests/protocol/test_lone_pub.py checks that they agree.
    """
    nl = data.find(b"\n", 4, 70)
    if nl < 0 or not data.startswith(b"PUB "):
        return None
    end = len(data)
    if end < nl + 5:
        return None
    size = _I32_unpack_from(data, nl + 1)[0]
    if end - nl - 5 != size or size <= 0 or size > max_msg_size:
        return None
    topic = data[4:nl]
    if not valid_topic_name(topic):
        return None
    return topic, data[nl + 5:]


_MARK_OPEN = b'{"##nsqx_producer":"'
_MARK_CHARS = frozenset(b"0123456789abcdefABCDEF.:-_")


def parse_lone_marked_pub(data: bytes, max_msg_size: int) -> tuple[bytes, bytes, bytes] | None:
    """(topic, producer mark, body) when ``data`` is exactly one ``PUB_EXT <topic>`` whose
    only header is ``{"##nsqx_producer":"<id>:<epoch>:<seq>"}`` (an idempotent producer's
    PUB), else None: the general path (parser, ``split_ext``, ``parse_ext_json``) takes the
    rest and gives the same result for these (tests/protocol/test_lone_pub.py).

    Speed: the idempotent producer's one-at-a-time PUB, as :func:`parse_lone_pub` is the
    plain one's."""
    nl = data.find(b"\n", 8, 74)
    if nl < 0 or not data.startswith(b"PUB_EXT "):
        return None
    end = len(data)
    if end < nl + 7:
        return None
    size = _I32_unpack_from(data, nl + 1)[0]
    if end - nl - 5 != size or size <= 0 or size > max_msg_size:
        return None
    jlen = _U16_unpack_from(data, nl + 5)[0]
    j0 = nl + 7
    jend = j0 + jlen
    if end <= jend or not data.startswith(_MARK_OPEN, j0) or data[jend - 2:jend] != b'"}':
        return None
    mark = data[j0 + len(_MARK_OPEN):jend - 2]
    if not mark or not _MARK_CHARS.issuperset(mark):
        return None
    topic = data[8:nl]
    if not valid_topic_name(topic):
        return None
    return topic, mark, data[jend:]


def _line_too_long(max_line: int) -> ProtocolError:
    # upstream just drops the connection (bufio.ErrBufferFull); we say why first
    return ProtocolError("E_INVALID", f"command line too long (max {max_line} bytes)")


# --------------------------------------------------------------------------- MPUB


def _check_mpub_count(count: int, max_body_size: int) -> None:
    # 4 == total num, 5 == length + min 1
    if count <= 0 or count > (max_body_size - 4) // 5:
        raise ProtocolError("E_BAD_BODY", f"MPUB invalid message count {count}")


def split_mpub(body: bytes | memoryview, max_msg_size: int,
               max_body_size: int | None = None) -> list[bytes]:
    """MPUB body ``[4B count]([4B size][bytes])*`` -> message bodies, upstream's checks/texts.

    Uniform batches (every size equal) take a path with no per-message Python code;
    mixed sizes a walk of the size fields with the checks done afterwards in C and one
    struct call cutting the bodies; any
    failure is re-walked by the checking loop for upstream's exact error. All three
    give identical results (tests/protocol). ``body`` may be a memoryview (no copy of
    the whole body first); the bodies returned are always bytes.
    """
    if len(body) < 4:
        raise ProtocolError("E_BAD_BODY", "MPUB failed to read message count")
    count = _I32_unpack_from(body, 0)[0]
    _check_mpub_count(count, len(body) + 4 if max_body_size is None else max_body_size)
    res = _split_uniform(body, count, max_msg_size)
    if res is None:
        res = _split_mixed(body, count, max_msg_size)
    if res is None:
        res = _split_general(body, count, max_msg_size)
    return res


def _split_uniform(body: bytes, count: int, max_msg_size: int) -> list[bytes] | None:
    """All sizes equal: 4 strided slice compares check every size field in C."""
    total = len(body) - 4
    stride, rem = divmod(total, count)
    if rem or stride < 5:
        return None
    size = stride - 4
    hdr = _I32.pack(size)
    for k in range(4):
        if body[4 + k :: stride] != hdr[k : k + 1] * count:
            return None
    if size > max_msg_size:
        raise ProtocolError("E_BAD_MESSAGE", f"MPUB message too big {size} > {max_msg_size}")
    if count <= _MAX_CUT:
        # one cached struct cuts every body: 23 ns/msg against 150 for slice objects
        return list(_uniform_cutter(size, count).unpack_from(body, 4))
    body = bytes(body)
    end = len(body)
    return list(map(body.__getitem__, map(slice, range(8, end, stride), range(8 + size, end + 1, stride))))


_MAX_CUT = 4096  # bigger batches are cut by slices: a struct's codes grow with the count


@lru_cache(maxsize=64)
def _uniform_cutter(size: int, count: int) -> struct.Struct:
    return struct.Struct(f"4x{size}s" * count)


def _split_mixed_py(body: bytes | memoryview, count: int, max_msg_size: int
                    ) -> list[bytes] | None:
    """Mixed sizes: the walk is inherently sequential (each size says where the next
    is), so keep its loop minimal and check every size afterwards with min/max in C.
    None = something is wrong: the checking loop finds what, with upstream's text.
    The twin of ``nsqx._speedups.split_mixed`` (the one used when it was built)."""
    if count > (len(body) - 4) // 5 or count > _MAX_CUT:
        return None  # cannot hold count messages of at least one byte each, or very many
    unpack = _I32_unpack_from
    sizes = [0] * count
    off = 4
    try:
        for i in range(count):
            size = unpack(body, off)[0]
            sizes[i] = size
            off += 4 + size
    except struct.error:  # ran past the end (or a negative size walked backwards)
        return None
    if off != len(body) or min(sizes) <= 0 or max(sizes) > max_msg_size:
        return None
    # one C call cuts every body: a struct format skipping each size field ("4x<n>s"),
    # half the cost of per-message slice objects
    return list(struct.Struct(("4x%ds" * count) % tuple(sizes)).unpack_from(body, 4))


_split_mixed = native.split_mixed if native is not None else _split_mixed_py


def _split_general(body: bytes | memoryview, count: int, max_msg_size: int) -> list[bytes]:
    body = bytes(body)  # bodies are bytes whatever the input (this path is rare)
    end = len(body)
    off = 4
    out: list[bytes] = []
    append = out.append
    for i in range(count):
        if end - off < 4:
            raise ProtocolError("E_BAD_MESSAGE", f"MPUB failed to read message({i}) body size")
        size = _I32_unpack_from(body, off)[0]
        off += 4
        if size <= 0:
            raise ProtocolError("E_BAD_MESSAGE", f"MPUB invalid message({i}) body size {size}")
        if size > max_msg_size:
            raise ProtocolError("E_BAD_MESSAGE", f"MPUB message too big {size} > {max_msg_size}")
        if end - off < size:
            raise ProtocolError("E_BAD_MESSAGE", "MPUB failed to read message body")
        append(body[off : off + size])
        off += size
    if off != end:
        # upstream ignores the declared size and would parse the rest as commands; we keep
        # the body bounded by its size, so leftover bytes are a bad body
        raise ProtocolError("E_BAD_BODY", f"MPUB invalid body size {end + 0}")
    return out


# --------------------------------------------------------------------------- headers, trace ids (Youzan)

TRACE_ID_KEY = "##trace_id"
TRACE_TOPIC = "__trace"  # where a node writes the events of its traced topics
DISPATCH_TAG_KEY = "##client_dispatch_tag"
# nsqx's controls on a PUB_EXT/MPUB_EXT batch's first message, taken off by nsqd (never
# stored): the batch's delay in ms (an idempotent deferred publish: DPUB carries no mark),
# and a forwarder's request to be told when a marked batch was a repeat (REPLAYED_SUFFIX)
DEFER_KEY = "##nsqx_defer"
ASK_REPLAYED_KEY = "##nsqx_ask_replayed"
MAX_TAG_LEN = 100  # Youzan's ext.MAX_TAG_LEN
MAX_EXT_JSON = 0xFFFF  # the 2-byte JSON length field (Youzan's ext.MaxExtLen)
_TAG_CHARS = re.compile(r"[a-zA-Z0-9_-]+")
_U16_unpack_from = struct.Struct(">H").unpack_from
_U64 = struct.Struct(">Q")
_TRACED = struct.Struct(">2sQQQI")  # "OK", id, trace id, offset, raw size: 30 bytes


def valid_tag(tag: str) -> bool:
    """Youzan's ``ext.ValidateTag``: 1..100 of ``[a-zA-Z0-9_-]``."""
    return 0 < len(tag) <= MAX_TAG_LEN and _TAG_CHARS.fullmatch(tag) is not None


def parse_ext_json(raw: bytes | str) -> dict[str, bytes]:
    """A message's JSON header -> its headers (values as UTF-8 bytes).

    The header must be a JSON object of string values (what Youzan's SDKs send), at most
    65535 bytes: anything else is the non-fatal ``E_INVALID_JSON_HEADER``. The reserved
    keys are checked as Youzan does: ``##trace_id`` a decimal uint64 string
    (``INVALID_TRACE_ID``), ``##client_dispatch_tag`` a valid tag (``E_BAD_TAG``).
    """
    if len(raw) > MAX_EXT_JSON:
        raise ProtocolError("E_INVALID_JSON_HEADER",
                            f"json header too long {len(raw)} > {MAX_EXT_JSON}", False)
    try:  # orjson: ~20x faster than json here, and it refuses NaN/Infinity as JSON does not
        obj = orjson.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise ProtocolError("E_INVALID_JSON_HEADER",
                            f"fail to parse json header:{exc.__class__.__name__}", False) from None
    if not isinstance(obj, dict):
        raise ProtocolError("E_INVALID_JSON_HEADER", "json header is not an object", False)
    out: dict[str, bytes] = {}
    for key, value in obj.items():
        if not isinstance(value, str):
            if key == TRACE_ID_KEY:
                raise ProtocolError("INVALID_TRACE_ID", "passin trace id should be string", False)
            raise ProtocolError("E_INVALID_JSON_HEADER",
                                f"json header value of {key!r} is not a string", False)
        try:
            out[key] = value.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate escape: not text
            raise ProtocolError("E_INVALID_JSON_HEADER",
                                f"json header value of {key!r} is not valid UTF-8", False) from None
        if not key:
            raise ProtocolError("E_INVALID_JSON_HEADER", "json header has an empty key", False)
    tid = out.get(TRACE_ID_KEY)
    if tid is not None and (not tid.isdigit() or len(tid) > 20 or int(tid) >= 1 << 64):
        raise ProtocolError("INVALID_TRACE_ID", "invalid trace id", False)
    tag = out.get(DISPATCH_TAG_KEY)
    if tag is not None and not valid_tag(tag.decode()):
        raise ProtocolError("E_BAD_TAG", f"invalid tag {tag.decode()!r}", False)
    return out


def split_ext(body: bytes, what: str = "PUB_EXT") -> tuple[dict[str, bytes] | None, bytes]:
    """``[2 json len][json header][body]`` -> (headers or None, body).

    A body that cannot hold its header and at least one byte is a fatal ``E_BAD_BODY``
    (Youzan's text); a JSON length of 0 means no header.
    """
    size = len(body)
    jlen = _U16_unpack_from(body, 0)[0] if size >= 2 else 0
    if size <= 2 + jlen:
        raise ProtocolError("E_BAD_BODY",
                            f"{what} invalid body size {size} in ext json header content length")
    if not jlen:
        return None, body[2:]
    return parse_ext_json(body[2 : 2 + jlen]) or None, body[2 + jlen :]


def _strip_no_ext_py(items: list[bytes]) -> list[bytes] | None:
    """MPUB_EXT messages that all carry no header (``[0x0000][body]``) -> their bodies;
    None when any has a header or is too short for a body (the caller splits each).

    Batched ingest's hot path (an idempotent producer's batch has the mark on its first
    message only). The twin of ``nsqx._speedups.strip_no_ext`` (used when it was built).
    """
    if items and (min(map(len, items)) <= 2 or {item[:2] for item in items} != _NO_EXT):
        return None
    return [item[2:] for item in items]


_NO_EXT = {b"\0\0"}  # an MPUB_EXT message's JSON length when it has no header
strip_no_ext = native.strip_no_ext if native is not None else _strip_no_ext_py


def _split_marked_py(body: bytes | memoryview, max_msg_size: int) -> list[bytes] | None:
    """An ``MPUB_EXT`` body of two or more messages whose messages after the first carry
    no header -> ``[first message as sent, body 2, ..., body n]``; None for any other body,
    or one ``split_mpub`` would refuse (the caller then takes the general way, which gives
    the errors). ``split_mpub`` + ``strip_no_ext`` in one step.

    Batched idempotent ingest's hot path (the mark rides on the first message only). The
    twin of ``nsqx._speedups.split_marked`` (one walk, one copy per message), compared by
    tests/test_speedups.py."""
    if len(body) < 4:
        return None
    count = _I32_unpack_from(body, 0)[0]
    if count < 2:
        return None
    raw = _split_mixed_py(body, count, max_msg_size)
    rest = _strip_no_ext_py(raw[1:]) if raw is not None else None
    return None if rest is None else [raw[0], *rest]  # type: ignore[index]


split_marked = native.split_marked if native is not None else _split_marked_py


def split_trace(body: bytes, what: str = "PUB_TRACE") -> tuple[int, bytes]:
    """``[8 trace id][body]`` -> (trace id, body); E_BAD_BODY when no body follows the id."""
    if len(body) <= 8:
        raise ProtocolError("E_BAD_BODY", f"{what} invalid body size {len(body)} with trace id enabled")
    return _U64.unpack_from(body, 0)[0], body[8:]


def traced_response(msg_id: int, trace_id: int, offset: int, raw_size: int) -> bytes:
    """Youzan's 30-byte answer to PUB_TRACE (and PUB_EXT with ``##trace_id``, MPUB_TRACE):
    ``OK`` + [8 message id][8 trace id][8 queue offset][4 raw size], big-endian."""
    return _TRACED.pack(b"OK", msg_id & _MASK64, trace_id & _MASK64, offset & _MASK64,
                        raw_size & 0xFFFFFFFF)


def parse_traced_response(data: bytes) -> tuple[int, int, int, int]:
    """Client side of traced_response: (message id, trace id, offset, raw size)."""
    if len(data) != _TRACED.size or data[:2] != b"OK":
        raise ValueError(f"not a traced response: {data[:40]!r}")
    return _TRACED.unpack(data)[1:]


def ext_json(headers: Mapping[str, bytes | str]) -> bytes:
    """Headers -> the JSON header Youzan's clients read (compact, keys in order)."""
    return json.dumps({k: v.decode("utf-8", "replace") if isinstance(v, bytes) else v
                       for k, v in headers.items()}, separators=(",", ":"),
                      ensure_ascii=False).encode()


# --------------------------------------------------------------------------- helpers the server calls


def cannot_in_state(command: str | bytes) -> ProtocolError:
    """``E_INVALID cannot <CMD> in current state`` (fatal)."""
    if isinstance(command, bytes):
        command = raw_text(command)
    return ProtocolError("E_INVALID", f"cannot {command} in current state")


def tls_required(command: str | bytes) -> ProtocolError:
    """``--tls-required`` and not upgraded: every command but IDENTIFY gets this (fatal)."""
    if isinstance(command, bytes):
        command = raw_text(command)
    return ProtocolError("E_INVALID", f"cannot {command} in current state (TLS required)")


def fin_failed(msg_id: bytes, reason: str) -> ProtocolError:
    """Non-fatal; reasons upstream uses: ``ID not in flight``, ``client does not own message``."""
    return ProtocolError("E_FIN_FAILED", f"FIN {raw_text(msg_id)} failed {reason}", False)


def req_failed(msg_id: bytes, reason: str) -> ProtocolError:
    return ProtocolError("E_REQ_FAILED", f"REQ {raw_text(msg_id)} failed {reason}", False)


def touch_failed(msg_id: bytes, reason: str) -> ProtocolError:
    return ProtocolError("E_TOUCH_FAILED", f"TOUCH {raw_text(msg_id)} failed {reason}", False)


def validate_message_id(mid: bytes) -> bytes:
    """Upstream only checks the length (16); E_INVALID ``invalid message ID``."""
    if len(mid) != MSG_ID_LENGTH:
        raise ProtocolError("E_INVALID", "invalid message ID")
    return mid


def parse_sub(params: Sequence[bytes]) -> tuple[str, str]:
    """SUB params -> (topic, channel); call after the state/heartbeat checks."""
    if len(params) < 2:
        raise ProtocolError("E_INVALID", "SUB insufficient number of parameters")
    topic, channel = params[0], params[1]
    if not valid_topic_name(topic):
        raise ProtocolError("E_BAD_TOPIC", f"SUB topic name {go_quote(topic)} is not valid")
    if not valid_channel_name(channel):
        raise ProtocolError("E_BAD_CHANNEL", f"SUB channel name {go_quote(channel)} is not valid")
    return topic.decode("ascii"), channel.decode("ascii")


# Largest log offset a position may name (message ids keep 48 bits of offset) and the
# largest unix time in seconds whose nanoseconds fit in an int64 (year 2262).
MAX_POSITION_OFFSET = (1 << 48) - 1
MAX_POSITION_SECONDS = ((1 << 63) - 1) // 1_000_000_000


class StartKind(StrEnum):
    """What a :class:`StartPosition` names. A str (``"earliest"`` equals
    ``StartKind.EARLIEST``), so the spelling on the wire and in logs is its value."""

    EARLIEST = "earliest"  # the oldest message still kept
    LATEST = "latest"  # the log end: only messages published from now on
    TIMESTAMP = "timestamp"  # value = unix seconds: the first message stored at or after it
    OFFSET = "offset"  # value = a log offset (the partition's message count before it)


@dataclass(frozen=True, slots=True)
class StartPosition:
    """Where a channel (re)starts reading its partition log: ``kind`` (a
    :class:`StartKind`; a str of its values is turned into one, anything else is a
    ValueError) and, for a time or an offset, ``value``. A time is found through the time
    index; an offset is a log offset, i.e. the partition's message count before that
    message.
    """

    kind: StartKind
    value: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", StartKind(self.kind))

    def to_text(self) -> str:
        """The position as :func:`parse_start_position` reads it back."""
        if self.kind in (StartKind.EARLIEST, StartKind.LATEST):
            return str(self.kind)
        return f"{self.kind}:{self.value}"


# Youzan's offset types (`ConsumeOffset`) plus nsqx's spellings, all on one log offset:
# Youzan's "virtual_queue" is a byte position in its queue file and "msgcount" a message
# index; an nsqx log offset is both at once (records are numbered, not addressed by byte).
_OFFSET_KINDS = {b"virtual_queue": StartKind.OFFSET, b"msgcount": StartKind.OFFSET,
                 b"offset": StartKind.OFFSET, b"timestamp": StartKind.TIMESTAMP}


def parse_start_position(raw: bytes) -> StartPosition:
    """``<type>:<value>`` (Youzan), or ``earliest`` / ``latest``; ProtocolError E_INVALID.

    Types: ``timestamp:<unix seconds>``, ``virtual_queue:<n>``, ``msgcount:<n>``,
    ``offset:<n>`` (all three the log offset n), ``special:-1`` (latest, as Youzan) and
    ``special:-2`` (earliest, Kafka's code for it). Values are ASCII decimal, no sign
    except special's; offsets above 2**48-1 and times past 2262 are refused.
    """
    text = bytes(raw).strip()
    if text in (b"earliest", b"latest"):
        return StartPosition(StartKind(text.decode()))
    kind, sep, value = text.partition(b":")
    if not sep:
        raise ProtocolError("E_INVALID", f"invalid start position {raw_text(text)}")
    if kind == b"special":
        if value == b"-1":
            return StartPosition(StartKind.LATEST)
        if value == b"-2":
            return StartPosition(StartKind.EARLIEST)
        raise ProtocolError("E_INVALID", f"invalid special start position {raw_text(value)}")
    name = _OFFSET_KINDS.get(kind)
    if name is None:
        raise ProtocolError("E_INVALID", f"invalid start position type {raw_text(kind)}")
    if not value or not value.isdigit() or len(value) > 20:
        raise ProtocolError("E_INVALID", f"invalid start position value {raw_text(value)}")
    n = int(value)
    limit = MAX_POSITION_SECONDS if name is StartKind.TIMESTAMP else MAX_POSITION_OFFSET
    if n > limit:
        raise ProtocolError("E_INVALID", f"start position {n} out of range 0-{limit}")
    return StartPosition(name, n)


def parse_partition(raw: bytes, command: str = "SUB") -> int:
    """A partition number (ASCII decimal, < 2**16); fatal ``E_BAD_PARTITION`` otherwise.

    Whether the topic has that partition is the server's check.
    """
    if not raw or not raw.isdigit() or len(raw) > 5 or int(raw) > 0xFFFF:
        raise ProtocolError("E_BAD_PARTITION", f"{command} partition {raw_text(raw)} is not valid")
    return int(raw)


def parse_sub_advanced(params: Sequence[bytes]
                       ) -> tuple[str, str, int, StartPosition | None]:
    """``SUB_ADVANCED <topic> <channel> <partition> [<type>:<value>]`` (Youzan).

    Returns (topic, channel, partition, start or None); call after the state checks.
    """
    if len(params) < 3:
        raise ProtocolError("E_INVALID", "SUB_ADVANCED insufficient number of parameters")
    if len(params) > 4:
        raise ProtocolError("E_INVALID", "SUB_ADVANCED too many parameters")
    topic, channel = params[0], params[1]
    if not valid_topic_name(topic):
        raise ProtocolError("E_BAD_TOPIC",
                            f"SUB_ADVANCED topic name {go_quote(topic)} is not valid")
    if not valid_channel_name(channel):
        raise ProtocolError("E_BAD_CHANNEL",
                            f"SUB_ADVANCED channel name {go_quote(channel)} is not valid")
    partition = parse_partition(params[2], "SUB_ADVANCED")
    start = parse_start_position(params[3]) if len(params) == 4 else None
    return topic.decode("ascii"), channel.decode("ascii"), partition, start


def parse_rdy(params: Sequence[bytes], max_rdy_count: int) -> int:
    """RDY count (1 if absent); out of range is fatal on purpose (client/server agree)."""
    count = 1
    if params:
        n = base10(params[0])
        if n is None:
            raise ProtocolError("E_INVALID", f"RDY could not parse count {raw_text(params[0])}")
        count = _to_int64(n)
    if count < 0 or count > max_rdy_count:
        raise ProtocolError("E_INVALID", f"RDY count {count} out of range 0-{max_rdy_count}")
    return count


def parse_fin(params: Sequence[bytes]) -> bytes:
    if not params:
        raise ProtocolError("E_INVALID", "FIN insufficient number of params")
    return validate_message_id(params[0])


def parse_touch(params: Sequence[bytes]) -> bytes:
    if not params:
        raise ProtocolError("E_INVALID", "TOUCH insufficient number of params")
    return validate_message_id(params[0])


def parse_req(params: Sequence[bytes], max_req_timeout_ms: int) -> tuple[bytes, int]:
    """REQ params -> (id, timeout_ms); the timeout is clamped to [0, max], never an error."""
    if len(params) < 2:
        raise ProtocolError("E_INVALID", "REQ insufficient number of params")
    mid = validate_message_id(params[0])
    n = base10(params[1])
    if n is None:
        raise ProtocolError("E_INVALID", f"REQ could not parse timeout {raw_text(params[1])}")
    # time.Duration(timeoutMs) * time.Millisecond, with Go's int64 wrap-around
    dur = _to_int64(_to_int64(n) * 1_000_000)
    if dur < 0:
        return mid, 0
    if dur > max_req_timeout_ms * 1_000_000:
        return mid, max_req_timeout_ms
    return mid, dur // 1_000_000


def _dpub_timeout(raw: bytes, max_req_timeout_ms: int | None) -> int:
    n = base10(raw)
    if n is None:
        raise ProtocolError("E_INVALID", f"DPUB could not parse timeout {raw_text(raw)}")
    dur = _to_int64(_to_int64(n) * 1_000_000)
    if max_req_timeout_ms is not None and (dur < 0 or dur > max_req_timeout_ms * 1_000_000):
        raise ProtocolError(
            "E_INVALID", f"DPUB timeout {n} out of range 0-{max_req_timeout_ms}")
    return dur // 1_000_000


def parse_dpub_timeout(params: Sequence[bytes], max_req_timeout_ms: int) -> int:
    """DPUB params (topic, defer_ms) -> defer ms; out of range is fatal, not clamped."""
    if len(params) < 2:
        raise ProtocolError("E_INVALID", "DPUB insufficient number of parameters")
    return _dpub_timeout(params[1], max_req_timeout_ms)


# --------------------------------------------------------------------------- IDENTIFY

_GO_INT = (-(1 << 63), (1 << 63) - 1)
_GO_INT32 = (-(1 << 31), (1 << 31) - 1)


class _Pairs(list):  # type: ignore[type-arg]
    """A JSON object's (key, value) pairs, in order (keeps duplicates like Go's decoder)."""


def _reject_constant(name: str) -> Any:
    raise ValueError(f"invalid JSON constant {name}")


def go_json_object(body: bytes, fields: Mapping[str, Any]) -> dict[str, Any]:
    """Decode ``body`` like Go's ``json.Unmarshal`` into a struct with ``fields``.

    ``fields`` maps JSON key -> ``bool`` | ``str`` | ``(lo, hi)`` int range. Like Go: keys
    match case-insensitively, unknown keys and ``null`` values are ignored, a top-level
    ``null`` gives all defaults, a wrong type or an out-of-range int is an error.
    Raises ValueError.
    """
    pairs = json.loads(
        body.decode("utf-8", "replace"),
        object_pairs_hook=_Pairs,
        parse_constant=_reject_constant,
    )
    if pairs is None:
        return {}
    if not isinstance(pairs, _Pairs):
        raise ValueError("cannot unmarshal non-object")
    out: dict[str, Any] = {}
    folded = {k.lower(): k for k in fields}
    for key, value in pairs:
        fname = key if key in fields else folded.get(key.lower())
        if fname is None or value is None:
            continue
        kind = fields[fname]
        if kind is bool:
            if type(value) is not bool:
                raise ValueError(f"{fname}: want bool")
        elif kind is str:
            if type(value) is not str:
                raise ValueError(f"{fname}: want string")
        else:
            lo, hi = kind
            if type(value) is not int or not lo <= value <= hi:
                raise ValueError(f"{fname}: want int")
        out[fname] = value
    return out


_IDENTIFY_FIELDS: dict[str, Any] = {
    "client_id": str,
    "hostname": str,
    "heartbeat_interval": _GO_INT,
    "output_buffer_size": _GO_INT,
    "output_buffer_timeout": _GO_INT,
    "feature_negotiation": bool,
    "tls_v1": bool,
    "deflate": bool,
    "deflate_level": _GO_INT,
    "snappy": bool,
    "sample_rate": _GO_INT32,
    "user_agent": str,
    "msg_timeout": _GO_INT,
    "topology_region": str,
    "topology_zone": str,
    # Youzan: the ext frame layout for messages, and tag dispatch
    "extend_support": bool,
    "desired_tag": str,
}


@dataclass(frozen=True)
class IdentifyLimits:
    """Server options IDENTIFY is validated against (upstream defaults, in ms)."""

    heartbeat_interval_ms: int = 30_000  # default: --client-timeout / 2
    max_heartbeat_interval_ms: int = 60_000
    output_buffer_size: int = 16 * 1024
    max_output_buffer_size: int = 64 * 1024
    output_buffer_timeout_ms: int = 250
    min_output_buffer_timeout_ms: int = 25
    max_output_buffer_timeout_ms: int = 30_000
    msg_timeout_ms: int = 60_000
    max_msg_timeout_ms: int = 15 * 60_000
    tls_available: bool = False  # server has a TLS config
    deflate_enabled: bool = True
    max_deflate_level: int = 6
    snappy_enabled: bool = True


@dataclass(frozen=True)
class IdentifySettings:
    """Normalized client settings after IDENTIFY (0 ms = disabled for heartbeat/flush)."""

    client_id: str
    hostname: str
    user_agent: str
    topology_region: str
    topology_zone: str
    heartbeat_interval_ms: int
    output_buffer_size: int
    output_buffer_timeout_ms: int
    sample_rate: int
    msg_timeout_ms: int
    feature_negotiation: bool
    # negotiated upgrades (False when feature_negotiation is False)
    tls_v1: bool
    snappy: bool
    deflate: bool
    deflate_level: int
    # Youzan's extensions ("" / False for stock clients)
    desired_tag: str = ""
    extend_support: bool = False


def parse_identify(body: bytes, limits: IdentifyLimits | None = None) -> IdentifySettings:
    """IDENTIFY JSON body -> settings, with upstream's checks, order and texts.

    Call after the state check; unknown keys are ignored (clients send short_id/long_id).
    """
    lim = limits or IdentifyLimits()
    try:
        d = go_json_object(body, _IDENTIFY_FIELDS)
    except (ValueError, RecursionError):
        raise ProtocolError("E_BAD_BODY", "IDENTIFY failed to decode JSON body") from None

    hb = d.get("heartbeat_interval", 0)
    if hb == -1:
        heartbeat = 0
    elif hb == 0:
        heartbeat = lim.heartbeat_interval_ms
    elif 1000 <= hb <= lim.max_heartbeat_interval_ms:
        heartbeat = hb
    else:
        raise ProtocolError("E_BAD_BODY", f"IDENTIFY heartbeat interval ({hb}) is invalid")

    obt = d.get("output_buffer_timeout", 0)
    if obt == -1:
        out_timeout = 0
    elif obt == 0:
        out_timeout = lim.output_buffer_timeout_ms
    elif lim.min_output_buffer_timeout_ms <= obt <= lim.max_output_buffer_timeout_ms:
        out_timeout = obt
    else:
        raise ProtocolError("E_BAD_BODY", f"IDENTIFY output buffer timeout ({obt}) is invalid")

    obs = d.get("output_buffer_size", 0)
    if obs == -1:
        out_size = 1
        out_timeout = 0
    elif obs == 0:
        out_size = lim.output_buffer_size
    elif 64 <= obs <= lim.max_output_buffer_size:
        out_size = obs
    else:
        raise ProtocolError("E_BAD_BODY", f"IDENTIFY output buffer size ({obs}) is invalid")

    sample_rate = d.get("sample_rate", 0)
    if sample_rate < 0 or sample_rate > 99:
        raise ProtocolError("E_BAD_BODY", f"IDENTIFY sample rate ({sample_rate}) is invalid")

    mt = d.get("msg_timeout", 0)
    if mt == 0:
        msg_timeout = lim.msg_timeout_ms
    elif 1000 <= mt <= lim.max_msg_timeout_ms:
        msg_timeout = mt
    else:
        raise ProtocolError("E_BAD_BODY", f"IDENTIFY msg timeout ({mt}) is invalid")

    tag = d.get("desired_tag", "")
    if len(tag) > MAX_TAG_LEN:
        raise ProtocolError("E_BAD_BODY", f"IDENTIFY invalid tag len {len(tag)}, exceed limit {MAX_TAG_LEN}")
    if tag and not valid_tag(tag):
        raise ProtocolError("E_BAD_BODY", f"IDENTIFY invalid tag {tag}")

    negotiate = d.get("feature_negotiation", False)
    tls = deflate = snappy = False
    level = 6
    if negotiate:
        tls = lim.tls_available and d.get("tls_v1", False)
        deflate = lim.deflate_enabled and d.get("deflate", False)
        req_level = d.get("deflate_level", 0)
        if deflate and req_level > 0:
            level = req_level
        level = min(level, lim.max_deflate_level)
        snappy = lim.snappy_enabled and d.get("snappy", False)
        if deflate and snappy:
            raise ProtocolError(
                "E_IDENTIFY_FAILED", "cannot enable both deflate and snappy compression")
    else:
        level = min(level, lim.max_deflate_level)

    return IdentifySettings(
        client_id=d.get("client_id", ""),
        hostname=d.get("hostname", ""),
        user_agent=d.get("user_agent", ""),
        topology_region=d.get("topology_region", ""),
        topology_zone=d.get("topology_zone", ""),
        heartbeat_interval_ms=heartbeat,
        output_buffer_size=out_size,
        output_buffer_timeout_ms=out_timeout,
        sample_rate=sample_rate,
        msg_timeout_ms=msg_timeout,
        feature_negotiation=negotiate,
        tls_v1=tls,
        snappy=snappy,
        deflate=deflate,
        deflate_level=level,
        desired_tag=tag,
        extend_support=d.get("extend_support", False),
    )


def go_json_string(s: str) -> str:
    """JSON string as Go's encoder writes it (HTML-safe escapes)."""
    return (
        json.dumps(s, ensure_ascii=False)
        .replace("<", "\\u003c")
        .replace(">", "\\u003e")
        .replace("&", "\\u0026")
        .replace("\u2028", "\\u2028")
        .replace("\u2029", "\\u2029")
    )


def identify_response(
    settings: IdentifySettings,
    *,
    max_rdy_count: int,
    version: str,
    max_msg_timeout_ms: int,
    max_deflate_level: int,
    auth_required: bool,
    topology_region: str = "",
    topology_zone: str = "",
) -> bytes:
    """The JSON IDENTIFY response (feature negotiation), keys in upstream's order."""
    def b(v: bool) -> str:
        return "true" if v else "false"

    return (
        f'{{"max_rdy_count":{max_rdy_count},"version":{go_json_string(version)},'
        f'"max_msg_timeout":{max_msg_timeout_ms},"msg_timeout":{settings.msg_timeout_ms},'
        f'"tls_v1":{b(settings.tls_v1)},"deflate":{b(settings.deflate)},'
        f'"deflate_level":{settings.deflate_level},"max_deflate_level":{max_deflate_level},'
        f'"snappy":{b(settings.snappy)},"sample_rate":{settings.sample_rate},'
        f'"auth_required":{b(auth_required)},"output_buffer_size":{settings.output_buffer_size},'
        f'"output_buffer_timeout":{settings.output_buffer_timeout_ms},'
        f'"topology_region":{go_json_string(topology_region)},'
        f'"topology_zone":{go_json_string(topology_zone)}'
        + (f',"desired_tag":{go_json_string(settings.desired_tag)}' if settings.desired_tag else "")
        + "}"
    ).encode()


def auth_response(identity: str, identity_url: str, permission_count: int) -> bytes:
    """AUTH success JSON, upstream's key order."""
    return (
        f'{{"identity":{go_json_string(identity)},"identity_url":{go_json_string(identity_url)},'
        f'"permission_count":{permission_count}}}'
    ).encode()


# --------------------------------------------------------------------------- client encoders


def _b(s: str | bytes) -> bytes:
    return s.encode() if isinstance(s, str) else s


def _line(*parts: str | bytes | int) -> bytes:
    return b" ".join(p if isinstance(p, bytes) else str(p).encode() if isinstance(p, int) else p.encode()
                     for p in parts) + b"\n"


def identify(data: Mapping[str, Any] | bytes) -> bytes:
    body = data if isinstance(data, bytes) else json.dumps(dict(data), separators=(",", ":")).encode()
    return b"IDENTIFY\n" + _U32.pack(len(body)) + body


def auth(secret: str | bytes) -> bytes:
    body = _b(secret)
    return b"AUTH\n" + _U32.pack(len(body)) + body


def sub(topic: str | bytes, channel: str | bytes) -> bytes:
    return _line(b"SUB", _b(topic), _b(channel))


def sub_ordered(topic: str | bytes, channel: str | bytes, partition: int) -> bytes:
    """Youzan's ``SUB_ORDERED <topic> <channel> <partition>``."""
    return _line(b"SUB_ORDERED", _b(topic), _b(channel), b"%d" % partition)


def sub_advanced(topic: str | bytes, channel: str | bytes, partition: int = 0,
                 start: str | bytes | None = None) -> bytes:
    """``SUB_ADVANCED``; ``start`` as ``"timestamp:1700000000"``, ``"msgcount:42"``,
    ``"earliest"``... (applied by the server only for a channel's first client)."""
    if start is None:
        return _line(b"SUB_ADVANCED", _b(topic), _b(channel), partition)
    return _line(b"SUB_ADVANCED", _b(topic), _b(channel), partition, _b(start))


def rdy(count: int) -> bytes:
    return b"RDY %d\n" % count


def fin(msg_id: bytes | str) -> bytes:
    return b"FIN " + _b(msg_id) + b"\n"


def req(msg_id: bytes | str, delay_ms: int = 0) -> bytes:
    return b"REQ %s %d\n" % (_b(msg_id), int(delay_ms))


def touch(msg_id: bytes | str) -> bytes:
    return b"TOUCH " + _b(msg_id) + b"\n"


def cls() -> bytes:
    return b"CLS\n"


def nop() -> bytes:
    return b"NOP\n"


def _route_head(cmd: bytes, topic: str | bytes, partition: int | None,
                route_version: int | None) -> bytes:
    if partition is None:
        if route_version is not None:
            raise ValueError("a route version needs a partition")
        return cmd + b" " + _b(topic)
    if route_version is None:
        return b"%s %s %d" % (cmd, _b(topic), partition)
    return b"%s %s %d %d" % (cmd, _b(topic), partition, route_version)


def pub(topic: str | bytes, body: bytes, partition: int | None = None,
        route_version: int | None = None) -> bytes:
    """PUB; with ``partition``, Youzan's ``PUB <topic> <partition>``; nsqx's route-managed
    topics also take the producer's route version: ``PUB <topic> <partition> <version>``."""
    return _route_head(b"PUB", topic, partition, route_version) + b"\n" + _U32.pack(len(body)) + body


def dpub(topic: str | bytes, delay_ms: int, body: bytes) -> bytes:
    return b"DPUB %s %d\n" % (_b(topic), int(delay_ms)) + _U32.pack(len(body)) + body


def mpub_body(bodies: Iterable[bytes]) -> bytes:
    """``[4B count]([4B size][bytes])*``."""
    bodies = list(bodies)
    if bodies and all(len(x) == len(bodies[0]) for x in bodies):
        hdr = _U32.pack(len(bodies[0]))
        return _U32.pack(len(bodies)) + hdr + hdr.join(bodies)
    parts = [_U32.pack(len(bodies))]
    for x in bodies:
        parts.append(_U32.pack(len(x)))
        parts.append(x)
    return b"".join(parts)


def mpub(topic: str | bytes, bodies: Iterable[bytes], partition: int | None = None,
         route_version: int | None = None) -> bytes:
    """MPUB; with ``partition``, Youzan's ``MPUB <topic> <partition>`` (and the route version,
    as :func:`pub`)."""
    body = mpub_body(bodies)
    return _route_head(b"MPUB", topic, partition, route_version) + b"\n" + _U32.pack(len(body)) + body


def _ext_part(headers: Mapping[str, bytes | str] | bytes | None, body: bytes) -> bytes:
    raw = b"" if not headers else headers if isinstance(headers, bytes) else ext_json(headers)
    return struct.pack(">H", len(raw)) + raw + body


def pub_ext(topic: str | bytes, body: bytes, headers: Mapping[str, bytes | str] | bytes | None,
            partition: int | None = None, route_version: int | None = None) -> bytes:
    """Youzan's ``PUB_EXT <topic> [<partition>]``: ``[4 size][2 json len][json][body]``;
    ``headers`` as a mapping or as raw JSON bytes (the route version as :func:`pub`)."""
    data = _ext_part(headers, body)
    head = _route_head(b"PUB_EXT", topic, partition, route_version)
    return head + b"\n" + _U32.pack(len(data)) + data


def mpub_ext(topic: str | bytes, messages: Iterable[tuple[Mapping[str, bytes | str] | bytes | None, bytes]],
             partition: int | None = None, route_version: int | None = None) -> bytes:
    """``MPUB_EXT``: an MPUB body whose messages are ``[2 json len][json][body]`` (the
    route version as :func:`pub`)."""
    body = mpub_body(_ext_part(h, b) for h, b in messages)
    head = _route_head(b"MPUB_EXT", topic, partition, route_version)
    return head + b"\n" + _U32.pack(len(body)) + body


def pub_trace(topic: str | bytes, trace_id: int, body: bytes, partition: int | None = None) -> bytes:
    """``PUB_TRACE``: ``[4 size][8 trace id][body]``; answered by traced_response."""
    data = _U64.pack(trace_id) + body
    head = b"PUB_TRACE " + _b(topic) if partition is None else b"PUB_TRACE %s %d" % (_b(topic), partition)
    return head + b"\n" + _U32.pack(len(data)) + data


def mpub_trace(topic: str | bytes, messages: Iterable[tuple[int, bytes]],
               partition: int | None = None) -> bytes:
    """``MPUB_TRACE``: an MPUB body whose messages are ``[8 trace id][body]``."""
    body = mpub_body(_U64.pack(t) + b for t, b in messages)
    head = b"MPUB_TRACE " + _b(topic) if partition is None else b"MPUB_TRACE %s %d" % (_b(topic), partition)
    return head + b"\n" + _U32.pack(len(body)) + body
