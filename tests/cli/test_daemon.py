"""Process-level settings every server applies at start (nsqx.cli.daemon)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest


def run(code: str) -> str:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], check=True,
                          capture_output=True, text=True, timeout=60).stdout.strip()


def test_open_file_limit_is_raised_to_the_hard_limit() -> None:
    out = run("""
        import resource
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        low = min(256, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (low, hard))
        from nsqx.cli.daemon import raise_open_file_limit
        got = raise_open_file_limit()
        print(got, resource.getrlimit(resource.RLIMIT_NOFILE)[0], hard)
    """)
    got, soft, hard = (int(x) for x in out.split())
    assert got == soft == hard


def test_malloc_keeps_large_buffers_on_the_heap() -> None:
    # glibc (Debian, CI): mallopt exists and accepts both settings
    assert run("from nsqx.cli.daemon import tune_malloc; print(tune_malloc())") == "True"


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc")
def test_an_unusable_data_path_is_one_fatal_line() -> None:
    """Issue 30 item 8: not CRITICAL + three ERRORs of a stop that had nothing to save.
    /proc passes the flag's check (a directory) but nothing can be made in it, even by root."""
    r = subprocess.run([sys.executable, "-m", "nsqx.cli.nsqd", "--data-path=/proc/nope",
                        "--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1
    lines = [ln for ln in r.stderr.splitlines() if " INFO: " not in ln]
    assert lines == ["FATAL: --data-path=/proc/nope cannot be used: No such file or directory"], \
        r.stderr
