"""`nsqadmin` entry point: parse upstream's flags, run until SIGTERM/SIGINT."""

from __future__ import annotations

from nsqx.admin.options import parse_args
from nsqx.admin.server import NSQAdmin
from nsqx.cli.daemon import Banner, run_daemon


def main(argv: list[str] | None = None) -> None:
    opts = parse_args(argv)

    def make():  # type: ignore[no-untyped-def]
        return NSQAdmin(opts)

    source = ("lookupd " + ",".join(opts.nsqlookupd_http_addresses)
              if opts.nsqlookupd_http_addresses else "nsqd " + ",".join(opts.nsqd_http_addresses))
    run_daemon(opts, make, "nsqx.admin", Banner(
        "nsqadmin", f"reading {source}", None, lambda a: f"HTTP {a.http_address}"))


if __name__ == "__main__":
    main()
