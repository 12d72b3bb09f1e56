"""`nsqadmin` entry point: parse upstream's flags, run until SIGTERM/SIGINT."""

from __future__ import annotations

from nsqx.admin.options import parse_args
from nsqx.cli.daemon import run_daemon


def main(argv: list[str] | None = None) -> None:
    opts = parse_args(argv)

    def make():  # type: ignore[no-untyped-def]
        from nsqx.admin.server import NSQAdmin

        return NSQAdmin(opts)

    run_daemon(opts, make, "nsqx.admin")


if __name__ == "__main__":
    main()
