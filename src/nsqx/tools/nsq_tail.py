"""``nsq_tail``: print the messages of one or more topics to stdout (upstream
``apps/nsq_tail``).

A consumer per ``--topic`` on ``--channel`` (default ``tail<6 digits>#ephemeral``). With
``-n N`` exactly N messages are printed in total and the tool exits 0; messages received
beyond N are requeued, not printed. SIGINT/SIGTERM: stop, answer in-flight messages, exit 0.
"""

from __future__ import annotations

import os
import random
import sys
from collections.abc import Sequence

from nsqx.client import Message
from nsqx.flags import Flag
from nsqx.protocol.names import valid_channel_name, valid_topic_name

from . import common

PROG = "nsq_tail"


def flags() -> list[Flag]:
    return [
        common.version_flag(),
        Flag("topic", "strings", [], "NSQ topic (may be given multiple times)"),
        *common.consumer_flags("", "NSQ channel (default tail<random 6 digits>#ephemeral)"),
        Flag("n", "int", 0, "total messages to show (will wait if starved)"),
        Flag("print-topic", "bool", False, "print topic name where message was received"),
        common.stats_interval_flag(0.0),
    ]


async def run(argv: Sequence[str] | None) -> int:
    opts = common.parse_flags(PROG, flags(), argv, __doc__ or "")
    common.setup_logging("warn")
    if not opts.channel:
        opts.channel = f"tail{random.randrange(999999):06d}#ephemeral"
    common.check_addresses(opts)
    if not opts.topic:
        raise common.Fatal("--topic required")
    for t in opts.topic:
        if not valid_topic_name(t):
            raise common.Fatal(f"--topic {t!r} is invalid")
    if not valid_channel_name(opts.channel):
        raise common.Fatal(f"--channel {opts.channel!r} is invalid")
    total = opts.n
    max_in_flight = opts.max_in_flight
    if 0 < total < max_in_flight:  # don't ask for more messages than we want
        max_in_flight = total
    co = common.conn_options(opts.consumer_opt, consumer=True, flag="consumer-opt",
                             user_agent=common.user_agent(PROG))
    kwargs = co.consumer_kwargs()
    kwargs.pop("max_in_flight", None)

    stop = common.StopSignal(PROG)
    out = sys.stdout.buffer
    reporter = common.RateReporter(PROG, opts.stats_interval)
    shown = 0
    failed: list[BaseException] = []

    def make_handler(topic: str):  # noqa: ANN202
        prefix = topic.encode() + b" | "

        def handle(msg: Message) -> None:
            nonlocal shown
            if failed or 0 < total <= shown:
                msg.requeue(0, backoff=False)  # not ours to show
                return
            try:
                if opts.print_topic:
                    out.write(prefix + msg.body + b"\n")
                else:
                    out.write(msg.body + b"\n")
                out.flush()
            except (OSError, ValueError) as e:  # e.g. `nsq_tail ... | head`
                msg.requeue(0, backoff=False)
                if not stop.is_set():
                    print(f"{PROG}: ERROR: failed to write to stdout - {e}", file=sys.stderr)
                    failed.append(e)
                    _silence_stdout()
                    stop.event.set()
                return
            shown += 1
            reporter.add()
            if 0 < total <= shown:
                stop.event.set()

        return handle

    await common.consume_until_stopped(
        opts, opts.topic, make_handler, stop, reporter, kwargs, max_in_flight=max_in_flight,
        announce=lambda t: print(f"Adding consumer for topic: {t}", file=sys.stderr))
    return 1 if failed else 0


def _silence_stdout() -> None:
    """stdout is gone: point fd 1 at /dev/null so the exit-time flush cannot fail."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


main = common.tool_main(PROG, run)


if __name__ == "__main__":
    main()
