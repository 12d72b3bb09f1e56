"""`nsqlookupd` entry point: parse upstream's flags, run until SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import logging
import signal

from nsqx.cli.nsqd import setup_logging
from nsqx.lookupd.options import Options, parse_args


async def run(opts: Options) -> None:
    from nsqx.lookupd.node import NSQLookupd

    loop = asyncio.get_running_loop()
    lookupd = NSQLookupd(opts)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await lookupd.start()
    except OSError as exc:
        logging.getLogger("nsqx.lookupd").critical("%s", exc)
        await lookupd.stop()
        raise SystemExit(1) from exc
    await stop.wait()
    await lookupd.stop()


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
