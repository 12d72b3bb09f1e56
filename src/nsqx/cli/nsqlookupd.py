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
            from nsqx.cluster.trust import load_secret, tls_contexts

            endpoints = [u for a in opts.cluster_leadership_addresses for u in a.split(",") if u]
            try:  # a bad secret file or etcd endpoint option: a clear error, no start
                secret = load_secret(opts.cluster_secret_file) if opts.cluster_secret_file else None
                tls = None
                if opts.cluster_tls_cert or opts.cluster_tls_key or opts.cluster_tls_ca:
                    tls = tls_contexts(opts.cluster_tls_cert, opts.cluster_tls_key,
                                       opts.cluster_tls_ca)[1]
                ClusterLookupd(node, endpoints, opts.cluster_id,
                               rebalance=opts.cluster_rebalance, secret=secret, tls=tls)
            except ValueError as e:
                raise SystemExit(f"FATAL: {e}") from None
        return node

    mode = ("cluster mode (etcd " + ",".join(opts.cluster_leadership_addresses) + ")"
            if opts.cluster_leadership_addresses else "standalone mode")
    run_daemon(opts, make, "nsqx.lookupd", Banner(
        "nsqlookupd", mode, None, lambda n: f"TCP {n.tcp_address}, HTTP {n.http_address}"))


if __name__ == "__main__":
    main()
