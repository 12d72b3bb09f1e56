"""Process-level settings every server applies at start (nsqx.cli.daemon)."""

from __future__ import annotations

import subprocess
import sys
import textwrap


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
