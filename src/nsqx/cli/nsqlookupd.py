"""`nsqlookupd` entry point: parse upstream's flags, run until SIGTERM/SIGINT."""

from __future__ import annotations

from nsqx.cli import lazy
from nsqx.cli.daemon import Banner, cluster_mode, cluster_settings, run_daemon
from nsqx.lookupd.node import NSQLookupd
from nsqx.lookupd.options import parse_args


def main(argv: list[str] | None = None) -> None:
    opts = parse_args(argv)

    def make():  # type: ignore[no-untyped-def]
        node = NSQLookupd(opts)
        if opts.cluster_leadership_addresses:
            try:  # a bad secret file or etcd endpoint option: a clear error, no start
                endpoints, secret, tls = cluster_settings(opts)
                lazy.cluster_lookupd()(node, endpoints, opts.cluster_id, rebalance=opts.cluster_rebalance,
                               secret=secret, tls=tls[1] if tls else None)  # a client only
            except ValueError as e:
                raise SystemExit(f"FATAL: {e}") from None
        return node

    run_daemon(opts, make, "nsqx.lookupd", Banner(
        "nsqlookupd", cluster_mode(opts), None,
        lambda n: f"TCP {n.tcp_address}, HTTP {n.http_address}"))


if __name__ == "__main__":
    main()
