"""The one shape of a consuming tool's ``run`` (``nsq_to_file``, ``nsq_to_nsq``,
``nsq_to_http``), so each tool writes only what differs: its flag checks, what it opens,
its message handler and what it closes.

:func:`run_consuming` parses the flags, sets up logging, lets the tool check its flags
(:class:`~nsqx.tools.common.Fatal`, exit 1), parses ``--consumer-opt``, installs the
SIGINT/SIGTERM handler and the progress reporter, lets the tool open what it writes to, then
consumes until stopped and lets the tool close what it opened whatever happened.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ClassVar

from nsqx.flags import Flag

from . import common

__all__ = ["ConsumingTool", "run_consuming"]


class ConsumingTool:
    """A tool that consumes ``opts.channel`` of some topics; a subclass overrides the
    methods where it differs. The defaults consume :meth:`topics` with
    :meth:`handler_for` through :func:`common.consume_until_stopped`."""

    prog: ClassVar[str]
    progress: Callable[[], str] | None = None  # more text for each progress line

    def __init__(self, opts: common.Options) -> None:
        self.opts = opts
        self.consumer_kwargs: dict[str, Any] = {}  # --consumer-opt, set before open()
        self.stop: common.StopSignal
        self.reporter: common.RateReporter

    def setup_logging(self) -> None:
        common.setup_logging("warn")

    def check(self) -> None:
        """Refuse bad flags with Fatal (before anything is opened)."""

    async def open(self) -> None:
        """Build what the messages go to (after the checks, before consuming)."""

    def topics(self) -> list[str]:
        return list(self.opts.topic)

    def handler_for(self, topic: str) -> Callable[..., Any]:
        raise NotImplementedError

    async def consume(self) -> None:
        """Consume until SIGINT/SIGTERM; closes the consumers and the reporter."""
        await common.consume_until_stopped(self.opts, self.topics(), self.handler_for,
                                           self.stop, self.reporter, self.consumer_kwargs)

    async def close(self) -> None:
        """Close what :meth:`open` built (also after a failure)."""


def consumer_kwargs(prog: str, opts: common.Options) -> dict[str, Any]:
    """``--consumer-opt`` as Consumer keywords; ``max_in_flight`` is the tool's own flag."""
    co = common.conn_options(opts.consumer_opt, consumer=True, flag="consumer-opt",
                             user_agent=common.user_agent(prog))
    kwargs = co.consumer_kwargs()
    kwargs.pop("max_in_flight", None)
    return kwargs


async def run_consuming(tool_cls: type[ConsumingTool], flags: list[Flag],
                        argv: Sequence[str] | None, doc: str) -> int:
    """The tool's ``run``: see the module's docstring for the order of the steps."""
    prog = tool_cls.prog
    tool = tool_cls(common.parse_flags(prog, flags, argv, doc))
    tool.setup_logging()
    tool.check()
    tool.consumer_kwargs = consumer_kwargs(prog, tool.opts)
    tool.stop = common.StopSignal(prog)
    tool.reporter = common.RateReporter(prog, tool.opts.stats_interval)
    tool.reporter.extra = tool.progress
    await tool.open()
    try:
        await tool.consume()
    finally:
        await tool.close()
    return 0
