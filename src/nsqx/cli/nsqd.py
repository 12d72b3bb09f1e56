"""`nsqd` entry point: parse upstream's flags, run a node until SIGTERM/SIGINT."""

from __future__ import annotations

from nsqx.cli import lazy
from nsqx.cli.daemon import Banner, cluster_mode, cluster_settings, run_daemon
from nsqx.nsqd.node import NSQD
from nsqx.nsqd.options import parse_args


def _addresses(node: NSQD) -> str:
    host = node.opts.tcp_address.rpartition(":")[0]
    out = [f"TCP {host}:{node.tcp_port}"]
    if node.opts.http_address:
        out.append(f"HTTP {node.opts.http_address.rpartition(':')[0]}:{node.http_port}")
    if node.https_port:
        out.append(f"HTTPS {node.opts.https_address.rpartition(':')[0]}:{node.https_port}")
    return ", ".join(out)


def main(argv: list[str] | None = None) -> None:
    opts = parse_args(argv)

    def make():  # type: ignore[no-untyped-def]
        node = NSQD(opts)
        if opts.cluster_leadership_addresses:
            try:  # a bad secret file or etcd endpoint option: a clear error, no start
                endpoints, secret, tls = cluster_settings(opts)
                node.plugins.append(lazy.node_member()(node, endpoints, opts.cluster_id,
                                               ttl=opts.cluster_node_ttl, secret=secret,
                                               cluster_address=opts.cluster_address, tls=tls))
            except ValueError as e:
                raise SystemExit(f"FATAL: {e}") from None
        return node

    run_daemon(opts, make, "nsqx.nsqd",
               Banner("nsqd", cluster_mode(opts), opts.data_path or ".", _addresses))


if __name__ == "__main__":
    main()
