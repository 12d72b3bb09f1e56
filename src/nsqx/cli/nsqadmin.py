"""`nsqadmin` entry point: parse upstream's flags, run until SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import logging
import signal

from nsqx.admin.options import Options, parse_args
from nsqx.cli.nsqd import setup_logging


async def run(opts: Options) -> None:
    from nsqx.admin.server import NSQAdmin

    loop = asyncio.get_running_loop()
    admin = NSQAdmin(opts)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await admin.start()
    except OSError as exc:
        logging.getLogger("nsqx.admin").critical("%s", exc)
        await admin.stop()
        raise SystemExit(1) from exc
    await stop.wait()
    await admin.stop()


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
