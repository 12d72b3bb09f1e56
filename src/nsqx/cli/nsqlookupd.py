"""`nsqlookupd` entry point: parse upstream's flags, run until SIGTERM/SIGINT."""

from __future__ import annotations

from nsqx.cli.daemon import run_daemon
from nsqx.lookupd.options import parse_args


def main(argv: list[str] | None = None) -> None:
    opts = parse_args(argv)

    def make():  # type: ignore[no-untyped-def]
        from nsqx.lookupd.node import NSQLookupd

        return NSQLookupd(opts)

    run_daemon(opts, make, "nsqx.lookupd")


if __name__ == "__main__":
    main()
