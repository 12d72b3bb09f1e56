"""What nsqd, nsqlookupd and nsqadmin say at start (nsqx.cli.daemon.Banner): version, build, mode and
data path first, the listening lines, then one ``ready`` line with the bound addresses."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

from tests.support.lookupd_process import LookupdFactory
from tests.support.nsqd_process import NsqdProcess

BUILD = rb"\(nsqx [\w.+-]+, (compiled C speedups|interpreted \([^)]*\))\)"


def _lines(log: bytes) -> list[bytes]:
    lines = [ln.split(b": ", 1)[1] for ln in log.splitlines() if b"INFO: " in ln]
    versions = [ln for ln in lines if b" v1.3.0 " in ln]
    assert len(versions) == 1, versions  # the banner, once (issue 30 item 8)
    return lines


def test_nsqd_banner_and_ready_line(nsqd: NsqdProcess) -> None:
    lines = _lines(nsqd.log_bytes())
    assert re.fullmatch(rb"nsqd v1\.3\.0 " + BUILD + rb", standalone mode, data path /\S+",
                        lines[0]), lines
    assert nsqd.data_path.resolve().as_posix().encode() in lines[0]
    ready = [i for i, ln in enumerate(lines) if ln.startswith(b"ready: ")]
    listening = [i for i, ln in enumerate(lines) if b": listening on " in ln]
    assert len(ready) == 1 and listening and max(listening) < ready[0], lines
    assert lines[ready[0]] == b"ready: TCP %s, HTTP %s" % (nsqd.tcp_address.encode(),
                                                           nsqd.http_address.encode())


def test_nsqlookupd_banner_and_ready_line(lookupd_factory: LookupdFactory) -> None:
    ld = lookupd_factory.start()
    lines = _lines(ld.log_bytes())
    assert re.fullmatch(rb"nsqlookupd v1\.3\.0 " + BUILD + rb", standalone mode", lines[0]), lines
    assert b"ready: TCP %s, HTTP %s" % (ld.tcp_address.encode(), ld.http_address.encode()) in lines


def test_nsqadmin_banner_and_ready_line(tmp_path: Path) -> None:
    log = tmp_path / "nsqadmin.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "nsqx.cli.nsqadmin",
                                 "--http-address=127.0.0.1:0", "--nsqd-http-address=127.0.0.1:9"],
                                stdout=out, stderr=subprocess.STDOUT, cwd=tmp_path)
    try:
        deadline = time.monotonic() + 30
        while b"ready: " not in log.read_bytes() and proc.poll() is None:
            assert time.monotonic() < deadline, log.read_bytes()
            time.sleep(0.05)
        lines = _lines(log.read_bytes())
        assert re.fullmatch(rb"nsqadmin v1\.3\.0 " + BUILD + rb", reading nsqd 127\.0\.0\.1:9",
                            lines[0]), lines
        assert any(re.fullmatch(rb"ready: HTTP 127\.0\.0\.1:\d+", ln) for ln in lines), lines
    finally:
        proc.kill()
        proc.wait()
