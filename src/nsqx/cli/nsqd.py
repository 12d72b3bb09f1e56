"""`nsqd` entry point: parse upstream's flags, run a node until SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys

from nsqx.nsqd.options import parse_args


def setup_logging(level: str, prefix: str) -> None:
    levels = {"debug": logging.DEBUG, "info": logging.INFO, "warn": logging.WARNING,
              "warning": logging.WARNING, "error": logging.ERROR, "fatal": logging.CRITICAL}
    logging.basicConfig(
        level=levels.get(str(level).lower(), logging.INFO),
        format=f"{prefix}%(asctime)s %(levelname)s: %(message)s",
        stream=sys.stderr,
    )


async def run(opts) -> None:  # type: ignore[no-untyped-def]
    from nsqx.nsqd.node import NSQD

    loop = asyncio.get_running_loop()
    nsqd = NSQD(opts, loop)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await nsqd.start()
    except OSError as exc:
        logging.getLogger("nsqx.nsqd").critical("failed to start: %s", exc)
        await nsqd.stop()
        raise SystemExit(1) from exc
    await stop.wait()
    await nsqd.stop()


def main(argv: list[str] | None = None) -> None:
    opts = parse_args(argv)
    setup_logging(opts.log_level, opts.log_prefix)
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    asyncio.run(run(opts))


if __name__ == "__main__":
    main()
