"""A client's malformed HTTP is the client's mistake: nsqd answers it as Go's net/http would
(400 / 431, plain text, no aiohttp parser text, no ``Server`` header) and logs one WARNING
line naming the client, never a traceback and never an ERROR line. The same for a body that
breaks off and for HTTP/1.1 without ``Host``. Control bytes from a TCP client are escaped in
the log line. Real nsqd processes, raw sockets; the assertions read the process's log."""

from __future__ import annotations

import re
import socket
import time

import pytest

from tests.support.nsqd_process import NsqdProcess


def _exchange(node: NsqdProcess, data: bytes, *, close_early: bool = False) -> bytes:
    """Send ``data`` to nsqd's HTTP port; the whole answer (b"" when we hang up first)."""
    host, port = node.http_address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(data)
        if close_early:
            return b""
        out = b""
        while chunk := s.recv(65536):  # until the server closes or the answer is whole
            out += chunk
            head, sep, body = out.partition(b"\r\n\r\n")
            length = re.search(rb"(?i)\r\ncontent-length: *(\d+)", head)
            if sep and length and len(body) >= int(length.group(1)):
                break
        return out


def _wait_log(node: NsqdProcess, pattern: bytes, before: int) -> bytes:
    """The log written since offset ``before`` once it matches ``pattern`` (10 s at most)."""
    deadline = time.monotonic() + 10
    while True:
        new = node.log_bytes()[before:]
        if re.search(pattern, new) or time.monotonic() > deadline:
            return new
        time.sleep(0.05)


def _assert_quiet(new: bytes) -> None:
    assert b"Traceback" not in new, new.decode(errors="replace")
    assert b"ERROR" not in new, new.decode(errors="replace")
    warnings = re.findall(rb"WARNING.*bad request from 127\.0\.0\.1(:\d+)? - .+", new)
    assert len(warnings) == 1, new.decode(errors="replace")


def _head(*lines: bytes, target: bytes = b"/pub?topic=t") -> bytes:
    return b"POST " + target + b" HTTP/1.1\r\nHost: x\r\n" + b"".join(
        line + b"\r\n" for line in lines) + b"\r\n"


CASES = {
    "negative-length": (_head(b"Content-Length: -5") + b"hello", b"400 Bad Request"),
    "text-length": (_head(b"Content-Length: abc") + b"hello", b"400 Bad Request"),
    "float-length": (_head(b"Content-Length: 1e20") + b"hello", b"400 Bad Request"),
    "huge-header": (_head(b"X-Big: " + b"a" * 9000, b"Content-Length: 2") + b"hi",
                    b"431 Request Header Fields Too Large"),
    "many-headers": (_head(*[b"X-%d: %s" % (i, b"b" * 100) for i in range(2000)],
                           b"Content-Length: 2") + b"hi", None),
    "long-url": (_head(b"Content-Length: 2", target=b"/pub?topic=t&x=" + b"u" * 20000) + b"hi",
                 b"431 Request Header Fields Too Large"),
    "bad-chunk": (_head(b"Transfer-Encoding: chunked") + b"zz\r\nhello\r\n0\r\n\r\n", None),
    "length-and-chunked": (_head(b"Content-Length: 5", b"Transfer-Encoding: chunked")
                           + b"5\r\nhello\r\n0\r\n\r\n", b"400 Bad Request"),
    "no-host": (b"POST /pub?topic=t HTTP/1.1\r\nContent-Length: 2\r\n\r\nhi",
                b"400 Bad Request: missing required Host header"),
    "no-host-aiohttp-path": (b"GET /ping HTTP/1.1\r\n\r\n",
                             b"400 Bad Request: missing required Host header"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_malformed_request_is_one_warning_and_a_go_answer(nsqd: NsqdProcess, case: str) -> None:
    data, body = CASES[case]
    before = len(nsqd.log_bytes())
    answer = _exchange(nsqd, data)
    status_line, _, rest = answer.partition(b"\r\n")
    assert re.match(rb"HTTP/1\.[01] (400|431) ", status_line), answer[:300]
    head, _, got_body = rest.partition(b"\r\n\r\n")
    assert b"server:" not in head.lower(), head
    assert b"aiohttp" not in answer.lower() and b"Python" not in answer, answer[:300]
    if body is not None:
        assert got_body.startswith(body), answer[:300]
    _assert_quiet(_wait_log(nsqd, rb"bad request from", before))
    assert _exchange(nsqd, b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n").startswith(
        b"HTTP/1.1 200")  # still serving


@pytest.mark.parametrize("target", [b"/pub?topic=t", b"/stats"])
def test_client_closing_mid_body_is_one_warning(nsqd: NsqdProcess, target: bytes) -> None:
    before = len(nsqd.log_bytes())
    _exchange(nsqd, _head(b"Content-Length: 100000", target=target) + b"x" * 10,
              close_early=True)
    new = _wait_log(nsqd, rb"bad request from|ERROR|Traceback", before)
    if target == b"/stats":  # a GET that never reads its body: nothing to blame anyone for
        assert b"Traceback" not in new and b"ERROR" not in new, new
        return
    _assert_quiet(new)


def test_good_response_has_no_server_header(nsqd: NsqdProcess) -> None:
    answer = _exchange(nsqd, b"GET /stats?format=json HTTP/1.1\r\nHost: x\r\n"
                             b"Connection: close\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
    assert b"\r\nserver:" not in answer.partition(b"\r\n\r\n")[0].lower()


def test_tcp_bad_command_is_logged_escaped(nsqd: NsqdProcess) -> None:
    host, port = nsqd.tcp_address.rsplit(":", 1)
    before = len(nsqd.log_bytes())
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(b"  V2BO\x00G\x1bUS\n")
        answer = s.recv(4096)
    assert b"E_INVALID" in answer
    new = _wait_log(nsqd, rb"E_INVALID", before)
    line = next(ln for ln in new.splitlines() if b"E_INVALID" in ln)
    assert b"\x00" not in line and b"\x1b" not in line, line
    assert b"BO\\x00G\\x1bUS" in line, line
    assert b"ERROR" not in line and b"Traceback" not in new, new
