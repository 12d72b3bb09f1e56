"""nsq_tail and to_nsq against a real nsqd."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

from tests.tools.helpers import channel_stats, consume, create_topic, pub, topic_stats, wait_for


def test_tail_prints_exactly_n(nsqd, tools) -> None:
    create_topic(nsqd.http_address, "tail_n")
    pub(nsqd.http_address, "tail_n", [f"m{i}".encode() for i in range(20)])
    t = tools.start("nsq_tail", ["--topic=tail_n", f"--nsqd-tcp-address={nsqd.tcp_address}",
                                 "-n", "7"])
    assert t.wait() == 0, t.stderr
    lines = t.stdout.splitlines()
    assert lines == [f"m{i}".encode() for i in range(7)]


def test_tail_print_topic_multiple_topics(nsqd, tools) -> None:
    for topic in ("tail_a", "tail_b"):
        create_topic(nsqd.http_address, topic)
        pub(nsqd.http_address, topic, [f"{topic}-{i}".encode() for i in range(5)])
    t = tools.start("nsq_tail", ["-topic=tail_a", "-topic=tail_b", "--print-topic",
                                 f"-nsqd-tcp-address={nsqd.tcp_address}", "-n=8"])
    assert t.wait() == 0, t.stderr
    lines = t.stdout.splitlines()
    assert len(lines) == 8
    for line in lines:
        topic, sep, body = line.partition(b" | ")
        assert sep and body.startswith(topic + b"-"), line
    assert {ln.split(b" | ")[0] for ln in lines} == {b"tail_a", b"tail_b"}


def test_tail_default_ephemeral_channel_and_sigterm(nsqd, tools) -> None:
    create_topic(nsqd.http_address, "tail_sig")
    t = tools.start("nsq_tail", ["--topic=tail_sig", f"--nsqd-tcp-address={nsqd.tcp_address}"])

    def chans():
        ts = topic_stats(nsqd.http_address, "tail_sig") or {}
        return [c["channel_name"] for c in ts.get("channels") or []]

    names = wait_for(chans, 15, "nsq_tail's channel")
    assert len(names) == 1 and names[0].startswith("tail") and names[0].endswith("#ephemeral")
    pub(nsqd.http_address, "tail_sig", [b"hello", b"world"])
    wait_for(lambda: t.stdout.count(b"\n") == 2, 10, "two lines")
    assert t.terminate(signal.SIGTERM) == 0, t.stderr
    assert t.stdout == b"hello\nworld\n"


def test_tail_sigint_with_lookupd(nsqd_factory, lookupd_factory, tools) -> None:
    ld = lookupd_factory.start()
    nsqd = nsqd_factory.start([f"--lookupd-tcp-address={ld.tcp_address}",
                               "--broadcast-address=127.0.0.1"])
    create_topic(nsqd.http_address, "tail_ld")
    wait_for(lambda: ld.get_json("/lookup?topic=tail_ld")[0] == 200, 10, "registration")
    pub(nsqd.http_address, "tail_ld", [b"x1", b"x2", b"x3"])
    t = tools.start("nsq_tail", ["--topic=tail_ld", f"--lookupd-http-address={ld.http_address}",
                                 "--channel=tailch"])
    wait_for(lambda: t.stdout.count(b"\n") == 3, 15, "three lines")
    assert t.terminate(signal.SIGINT) == 0, t.stderr
    c = channel_stats(nsqd.http_address, "tail_ld", "tailch")
    assert c is not None and c["depth"] == 0 and c["in_flight_count"] == 0


def test_to_nsq_publishes_lines(nsqd, tools) -> None:
    data = b"".join(f"line {i}\n".encode() for i in range(300)) + b"\n\nlast-no-newline"
    r = tools.run("to_nsq", ["--topic=to_nsq_lines", f"--nsqd-tcp-address={nsqd.tcp_address}"],
                  input=data)
    assert r.returncode == 0, r.stderr
    ts = topic_stats(nsqd.http_address, "to_nsq_lines")
    assert ts is not None and ts["message_count"] == 301
    got = consume(nsqd.tcp_address, "to_nsq_lines", 301)
    assert got == [f"line {i}".encode() for i in range(300)] + [b"last-no-newline"]


def test_to_nsq_delimiter_and_several_nsqd(nsqd_factory, tools) -> None:
    a = nsqd_factory.start()
    b = nsqd_factory.start()
    r = tools.run("to_nsq", ["-topic", "to_nsq_delim", "-delimiter", ",",
                             f"--nsqd-tcp-address={a.tcp_address}",
                             f"--nsqd-tcp-address={b.tcp_address}"],
                  input=b"one,two,,three")
    assert r.returncode == 0, r.stderr
    for n in (a, b):  # every line goes to every nsqd, as upstream
        assert topic_stats(n.http_address, "to_nsq_delim")["message_count"] == 3
        assert consume(n.tcp_address, "to_nsq_delim", 3) == [b"one", b"two", b"three"]


def test_to_nsq_rate_limits(nsqd, tools) -> None:
    data = b"".join(f"r{i}\n".encode() for i in range(25))
    start = time.monotonic()
    r = tools.run("to_nsq", ["--topic=to_nsq_rate", f"--nsqd-tcp-address={nsqd.tcp_address}",
                             "--rate=20", "--producer-opt=heartbeat_interval,10s"], input=data)
    elapsed = time.monotonic() - start
    assert r.returncode == 0, r.stderr
    assert topic_stats(nsqd.http_address, "to_nsq_rate")["message_count"] == 25
    assert elapsed >= 0.9  # 24 tokens at 20/s after the first: >= 1.2 s; loosely asserted


def test_to_nsq_sigterm_while_stdin_open(nsqd, tools) -> None:
    t = tools.start("to_nsq", ["--topic=to_nsq_sig", f"--nsqd-tcp-address={nsqd.tcp_address}",
                               "--stats-interval=100ms"], stdin=subprocess.PIPE)
    assert t.proc.stdin is not None
    t.proc.stdin.write(b"a\nb\nc\n")
    t.proc.stdin.flush()
    wait_for(lambda: (topic_stats(nsqd.http_address, "to_nsq_sig") or {}).get(
        "message_count") == 3, 15, "3 messages")
    t.wait_stderr("] 3 msgs, ")  # the periodic rate line
    assert t.terminate() == 0, t.stderr
    assert "total 3 msgs" in t.stderr
    t.proc.stdin.close()


def test_tail_into_closed_pipe_exits(nsqd, tools) -> None:
    create_topic(nsqd.http_address, "tail_pipe")
    pub(nsqd.http_address, "tail_pipe", [b"p0"])
    tail = subprocess.Popen(
        [sys.executable, "-m", "nsqx.tools.nsq_tail", "--topic=tail_pipe",
         f"--nsqd-tcp-address={nsqd.tcp_address}", "--channel=pipe"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert tail.stdout is not None
        assert tail.stdout.readline() == b"p0\n"
        tail.stdout.close()  # like `nsq_tail ... | head -1`
        pub(nsqd.http_address, "tail_pipe", [f"p{i}".encode() for i in range(1, 6)])
        rc = tail.wait(20)
    finally:
        if tail.poll() is None:
            tail.kill()
    err = tail.stderr.read() if tail.stderr else b""
    assert rc == 1, err
    assert b"failed to write to stdout" in err and b"Traceback" not in err
    c = channel_stats(nsqd.http_address, "tail_pipe", "pipe")
    # p0 was printed (FIN); p1..p5 could not be: requeued, none lost
    assert c["in_flight_count"] == 0 and c["depth"] + c["deferred_count"] == 5, json.dumps(c)
