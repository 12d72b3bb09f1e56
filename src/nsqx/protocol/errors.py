"""Protocol errors carrying upstream's error codes and texts.

The error frame payload is ``f"{code} {text}"`` exactly as nsqd sends it, so texts here are
copied from upstream (``nsqd/protocol_v2.go``, ``nsqlookupd/lookup_protocol_v1.go``).
Raw client bytes inside texts are kept byte-exact through ``surrogateescape``.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "NON_FATAL_CODES",
    "ProtocolError",
    "fatal",
    "go_quote",
    "non_fatal",
    "raw_text",
]

# Upstream's only non-fatal (ClientErr) codes; nsqjs hard-codes this exact list.
NON_FATAL_CODES = frozenset({"E_FIN_FAILED", "E_REQ_FAILED", "E_TOUCH_FAILED"})


class ProtocolError(Exception):
    """An error a client caused: answered with an error frame, fatal ones also close.

    ``commands`` holds the commands a parser completed in the same ``feed()`` call before
    the error, so the server can execute them (in order) before sending the error, as
    upstream's line-by-line loop would.
    """

    code: str
    text: str
    fatal: bool
    commands: list[Any]

    def __init__(self, code: str, text: str, fatal: bool = True) -> None:
        super().__init__(f"{code} {text}")
        self.code = code
        self.text = text
        self.fatal = fatal
        self.commands = []

    @property
    def payload(self) -> bytes:
        """The error frame data (``b"E_CODE text"``), raw client bytes restored."""
        return f"{self.code} {self.text}".encode("utf-8", "surrogateescape")

    def __repr__(self) -> str:
        return f"ProtocolError({self.code!r}, {self.text!r}, fatal={self.fatal})"


def fatal(code: str, text: str) -> ProtocolError:
    """A FatalClientErr: error frame then close."""
    return ProtocolError(code, text, True)


def non_fatal(code: str, text: str) -> ProtocolError:
    """A ClientErr: error frame, connection stays open."""
    return ProtocolError(code, text, False)


def raw_text(b: bytes) -> str:
    """Client bytes as Go's ``%s`` would print them (byte-exact on re-encode)."""
    return b.decode("utf-8", "surrogateescape")


_SIMPLE_ESCAPES = {7: "\\a", 8: "\\b", 12: "\\f", 10: "\\n", 13: "\\r", 9: "\\t", 11: "\\v",
                   0x22: '\\"', 0x5C: "\\\\"}


def go_quote(b: bytes | str) -> str:
    """Go's ``strconv.Quote`` (``%q``): used by upstream for topic/channel names in errors."""
    if isinstance(b, str):
        b = b.encode("utf-8", "surrogateescape")
    if b.isascii():
        # fast path: printable ASCII needs no escapes except quote and backslash
        s = b.decode("ascii")
        if s.isprintable() and '"' not in s and "\\" not in s:
            return f'"{s}"'
    out = ['"']
    i = 0
    n = len(b)
    while i < n:
        c = b[i]
        if c < 0x80:
            esc = _SIMPLE_ESCAPES.get(c)
            if esc is not None:
                out.append(esc)
            elif 0x20 <= c < 0x7F:
                out.append(chr(c))
            else:
                out.append(f"\\x{c:02x}")
            i += 1
            continue
        # decode one UTF-8 rune; invalid bytes are escaped as \xNN like Go
        width = 2 if c >= 0xC2 and c < 0xE0 else 3 if 0xE0 <= c < 0xF0 else 4 if 0xF0 <= c < 0xF5 else 0
        ch = None
        if width:
            try:
                ch = b[i : i + width].decode("utf-8")
            except UnicodeDecodeError:
                ch = None
        if ch is None or len(ch) != 1:
            out.append(f"\\x{c:02x}")
            i += 1
            continue
        cp = ord(ch)
        if ch.isprintable():
            out.append(ch)
        elif cp < 0x10000:
            out.append(f"\\u{cp:04x}")
        else:
            out.append(f"\\U{cp:08x}")
        i += width
    out.append('"')
    return "".join(out)
