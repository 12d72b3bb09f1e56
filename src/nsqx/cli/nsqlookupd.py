"""`nsqlookupd` entry point: parse upstream's flags, run until SIGTERM/SIGINT."""

from __future__ import annotations

from nsqx.cli.daemon import Banner, run_daemon
from nsqx.lookupd.options import parse_args


def main(argv: list[str] | None = None) -> None:
    opts = parse_args(argv)

    def make():  # type: ignore[no-untyped-def]
        from nsqx.lookupd.node import NSQLookupd

        node = NSQLookupd(opts)
        if opts.cluster_leadership_addresses:
            from nsqx.cluster.lookupd_api import ClusterLookupd

            endpoints = [u for a in opts.cluster_leadership_addresses for u in a.split(",") if u]
            ClusterLookupd(node, endpoints, opts.cluster_id, rebalance=opts.cluster_rebalance)
        return node

    mode = ("cluster mode (etcd " + ",".join(opts.cluster_leadership_addresses) + ")"
            if opts.cluster_leadership_addresses else "standalone mode")
    run_daemon(opts, make, "nsqx.lookupd", Banner(
        "nsqlookupd", mode, None, lambda n: f"TCP {n.tcp_address}, HTTP {n.http_address}"))


if __name__ == "__main__":
    main()
