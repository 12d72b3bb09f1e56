"""--help/--version/bad flags of every tool (no servers needed)."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

TOOLS = ["nsq_tail", "to_nsq", "nsq_to_file", "nsq_to_http", "nsq_to_nsq", "nsq_stat"]


def _run(name: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", f"nsqx.tools.{name}", *args],
                          capture_output=True, text=True, timeout=30)


@pytest.mark.parametrize("name", TOOLS)
@pytest.mark.parametrize("flag", ["--help", "-help", "-h"])
def test_help_mentions_every_flag(name: str, flag: str) -> None:
    r = _run(name, flag)
    assert r.returncode == 0, r.stderr
    mod = importlib.import_module(f"nsqx.tools.{name}")
    for f in mod.flags():
        assert f"  -{f.name}" in r.stdout, f"{name} --help lacks -{f.name}"
        assert f.help.split()[0] in r.stdout
    assert f"Usage of {name}:" in r.stdout


def test_help_shows_upstream_defaults() -> None:
    out = _run("nsq_to_file", "--help").stdout
    assert '(default "nsq_to_file")' in out
    assert '(default "<TOPIC>.<HOST><REV>.<DATETIME>.log")' in out
    assert '(default "%Y-%m-%d_%H")' in out
    assert "(default 30s)" in out and "(default 1m0s)" in out and "(default 200)" in out
    out = _run("nsq_to_http", "--help").stdout
    assert "(default 20s)" in out and '(default "hostpool")' in out and "(default 100)" in out
    out = _run("nsq_stat", "--help").stdout
    assert "(default 2s)" in out


@pytest.mark.parametrize("name", TOOLS)
def test_version(name: str) -> None:
    r = _run(name, "--version")
    assert r.returncode == 0
    assert r.stdout.startswith(f"{name} v")


@pytest.mark.parametrize("name", TOOLS)
def test_unknown_flag_exits_2(name: str) -> None:
    r = _run(name, "--no-such-flag=1")
    assert r.returncode == 2
    assert "no-such-flag" in r.stderr


@pytest.mark.parametrize("name,args,msg", [
    ("nsq_tail", ["--nsqd-tcp-address=127.0.0.1:1"], "--topic required"),
    ("nsq_tail", ["--topic=t"], "--nsqd-tcp-address or --lookupd-http-address required"),
    ("nsq_tail", ["--topic=t", "--nsqd-tcp-address=a:1", "--lookupd-http-address=b:2"],
     "not both"),
    ("to_nsq", ["--topic=t", "--nsqd-tcp-address=a:1", "--delimiter=ab"], "single byte"),
    ("to_nsq", ["--nsqd-tcp-address=a:1"], "--topic required"),
    ("nsq_to_file", ["--topic=t", "--nsqd-tcp-address=a:1", "--gzip",
                     "--filename-format=<TOPIC>.log"], "missing <REV>"),
    ("nsq_to_file", ["--topic-pattern=x", "--nsqd-tcp-address=a:1"],
     "--lookupd-http-address must be specified"),
    ("nsq_to_file", ["--topic=t", "--nsqd-tcp-address=a:1", "--gzip-level=10"], "gzip-level"),
    ("nsq_to_http", ["--topic=t", "--nsqd-tcp-address=a:1"], "--get or --post required"),
    ("nsq_to_http", ["--topic=t", "--nsqd-tcp-address=a:1", "--get=http://x/"],
     "printf string"),
    ("nsq_to_http", ["--topic=t", "--nsqd-tcp-address=a:1", "--get=http://x/%s",
                     "--content-type=text/plain"], "only used with --post"),
    ("nsq_to_http", ["--topic=t", "--nsqd-tcp-address=a:1", "--post=http://x/",
                     "--sample=2"], "--sample"),
    ("nsq_to_nsq", ["--topic=t", "--nsqd-tcp-address=a:1"],
     "--destination-nsqd-tcp-address required"),
    ("nsq_to_nsq", ["--topic=t", "--nsqd-tcp-address=a:1", "--destination-nsqd-tcp-address=b:1",
                    "--consumer-opt=bogus,1"], "unknown option"),
    ("nsq_stat", ["--topic=t"], "--topic and --channel are required"),
    ("nsq_stat", ["--topic=t", "--channel=c", "--nsqd-http-address=http://x:1"],
     "should not contain scheme"),
    ("nsq_stat", ["--topic=t", "--channel=c", "--nsqd-http-address=x:1", "--count=0"],
     "--count should be positive"),
])
def test_fatal_usage_errors_exit_1(name: str, args: list[str], msg: str) -> None:
    r = _run(name, *args)
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert msg in r.stderr


def test_go_flag_syntax_accepted() -> None:
    # Go's single dash, bare booleans and "--flag value" all parse
    r = _run("nsq_to_file", "-topic", "t", "-nsqd-tcp-address=a:1", "-gzip", "-gzip-level", "10")
    assert r.returncode == 1 and "gzip-level" in r.stderr


def test_consumer_opt_parsing() -> None:
    from nsqx.tools.common import Fatal, conn_options

    co = conn_options(["max_attempts,3", "default_requeue_delay,250ms", "snappy",
                       "heartbeat_interval,5s", "backoff_multiplier,100ms", "dial_timeout,2s"],
                      consumer=True, flag="consumer-opt", user_agent="ua")
    assert co.consumer == {"max_attempts": 3, "requeue_delay": 0.25, "backoff_multiplier": 0.1}
    assert co.conn == {"snappy": True, "heartbeat_interval": 5.0, "connect_timeout": 2.0,
                       "user_agent": "ua"}
    with pytest.raises(Fatal):
        conn_options(["max_attempts,x"], consumer=True, flag="consumer-opt")
    with pytest.raises(Fatal):  # consumer-only option on a producer
        conn_options(["max_attempts,3"], consumer=False, flag="producer-opt")
    co = conn_options(["tls_v1,true"], consumer=False, flag="producer-opt")
    assert co.conn["tls"] is True


def test_get_url_escapes_like_go() -> None:
    from nsqx.tools.nsq_to_http import get_url

    assert get_url("http://h/x?m=%s&p=100%%", b"a b&c/d") == "http://h/x?m=a+b%26c%2Fd&p=100%"


def test_json_filter_like_upstream() -> None:
    from nsqx.tools.nsq_to_nsq import JSONFilter

    f = JSONFilter("kind", "5", ["a", "kind"])
    assert f.should_pass({"kind": 5}) == (True, False)
    assert f.should_pass({"kind": 5.0}) == (True, False)
    assert f.should_pass({"kind": "5"}) == (True, False)
    assert f.should_pass({"kind": True}) == (False, False)
    assert f.should_pass({"kind": 6}) == (False, False)
    assert f.should_pass({"other": 1}) == (False, True)  # missing field + value: backoff
    assert JSONFilter("kind", "", []).should_pass({"other": 1}) == (False, False)
    assert f.filter({"kind": 1.0, "a": [1], "z": 2}, b"") == b'{"a":[1],"kind":1}'


def test_host_pool_skips_failed_hosts() -> None:
    from nsqx.tools.nsq_to_http import HostPool

    p = HostPool(["a", "b", "c"])
    assert [p.get() for _ in range(3)] == ["a", "b", "c"]
    p.mark("b", False)
    assert [p.get() for _ in range(4)] == ["a", "c", "a", "c"]
    p.mark("a", False)
    p.mark("c", False)
    assert p.get() in ("a", "b", "c")  # all dead: revived


def test_destinations_pick_and_mark_by_mode() -> None:
    """nsq_to_nsq's and nsq_to_http's shared choice of address (tools.nsq_to_http)."""
    from nsqx.tools.nsq_to_http import Destinations

    rr = Destinations(["a", "b", "c"], "round-robin", 0)
    assert [rr.pick() for _ in range(4)] == ["b", "c", "a", "b"]  # upstream starts at 1
    rr.failed("c")
    assert [rr.pick() for _ in range(3)] == ["c", "a", "b"]  # round-robin never skips
    for mode in ("hostpool", "epsilon-greedy"):
        hp = Destinations(["a", "b", "c"], mode, 0)
        hp.failed("b")
        assert [hp.pick() for _ in range(4)] == ["a", "c", "a", "c"]
        hp.done("b", 0.0)
        assert "b" in [hp.pick() for _ in range(3)]
    fan = Destinations(["a", "b"], "fanout", 0)
    fan.failed("a")
    assert not fan.pool.dead_until  # fanout publishes to all: nothing is marked


def test_rate_reporter_tty_line_in_place() -> None:
    import asyncio
    import io

    from nsqx.tools.common import RateReporter

    class TTY(io.StringIO):
        def isatty(self) -> bool:
            return True

    async def go(stream: io.StringIO) -> str:
        r = RateReporter("x", 0.05, stream=stream)
        r.start()
        r.add(10)
        await asyncio.sleep(0.18)
        await r.close()
        return stream.getvalue()

    tty = asyncio.run(go(TTY()))
    assert tty.count("\r\x1b[2K[x] 10 msgs, ") >= 2 and tty.count("\n") == 1
    assert tty.endswith("\r\x1b[2K[x] total 10 msgs in " + tty.split(" in ")[-1])
    plain = asyncio.run(go(io.StringIO()))
    assert "\r" not in plain and plain.count("[x] 10 msgs, ") >= 2 and "total 10 msgs" in plain
