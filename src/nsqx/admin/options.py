"""nsqadmin's options: upstream's flags, defaults and config file (``apps/nsqadmin``).

Precedence is go-options': command line > ``--config`` TOML file > default. Durations are
float seconds. Two flags are nsqx's own: ``--stats-sample-interval`` and
``--stats-sample-window`` size the built-in graphs (a ring buffer of ``/stats`` samples).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

from nsqx.flags import (
    LOG_LEVELS,
    Flag,
    Program,
    basic_flags,
    http_client_flags,
    listen_flag,
    peer_flag,
)
from nsqx.netutil import check_peer_address

__all__ = ["LOG_LEVELS", "Options", "OptionsError", "flag_set", "load", "normalize_base_path",
           "parse_args", "version_string"]

class OptionsError(ValueError):
    """Options nsqadmin refuses to start with."""


def normalize_base_path(p: str) -> str:
    """Upstream's normalizeBasePath: leading slash, path.Clean (no trailing slash but "/")."""
    if not p:
        return "/"
    if not p.startswith("/"):
        p = "/" + p
    parts: list[str] = []
    for seg in p.split("/"):
        if seg in ("", "."):
            continue
        if seg == "..":
            if parts:
                parts.pop()
            continue
        parts.append(seg)
    return "/" + "/".join(parts)


@dataclass
class Options:
    log_level: str = "info"
    log_prefix: str = "[nsqadmin] "
    http_address: str = "0.0.0.0:4171"
    base_path: str = "/"
    dev_static_dir: str = ""
    graphite_url: str = ""
    proxy_graphite: bool = False
    statsd_prefix: str = "nsq.%s"
    statsd_counter_format: str = "stats.counters.%s.count"
    statsd_gauge_format: str = "stats.gauges.%s"
    statsd_interval: float = 60.0
    nsqlookupd_http_addresses: list[str] = field(default_factory=list)
    nsqd_http_addresses: list[str] = field(default_factory=list)
    http_client_connect_timeout: float = 2.0
    http_client_request_timeout: float = 5.0
    http_client_tls_insecure_skip_verify: bool = False
    http_client_tls_root_ca_file: str = ""
    http_client_tls_cert: str = ""
    http_client_tls_key: str = ""
    # nsqx: the secret sent (Authorization: Bearer) to nodes with --auth-http-address
    http_client_auth_secret_file: str = ""
    allow_config_from_cidr: str = "127.0.0.1/8"
    notification_http_endpoint: str = ""
    acl_http_header: str = "X-Forwarded-User"
    admin_users: list[str] = field(default_factory=list)
    # nsqx: built-in graphs without Graphite
    stats_sample_interval: float = 10.0
    stats_sample_window: float = 3600.0

    def validate(self) -> None:
        """Upstream ``nsqadmin.New``'s checks, same messages."""
        if self.log_level not in LOG_LEVELS:
            raise OptionsError(
                f"invalid log level '{self.log_level}' (debug, info, warn, error, fatal)")
        if not self.nsqd_http_addresses and not self.nsqlookupd_http_addresses:
            raise OptionsError("--nsqd-http-address or --lookupd-http-address required")
        if self.nsqd_http_addresses and self.nsqlookupd_http_addresses:
            raise OptionsError("use --nsqd-http-address or --lookupd-http-address not both")
        if self.http_client_tls_cert and not self.http_client_tls_key:
            raise OptionsError("--http-client-tls-key must be specified with --http-client-tls-cert")
        if self.http_client_tls_key and not self.http_client_tls_cert:
            raise OptionsError("--http-client-tls-cert must be specified with --http-client-tls-key")
        for flag, addrs in (("--lookupd-http-address", self.nsqlookupd_http_addresses),
                            ("--nsqd-http-address", self.nsqd_http_addresses)):
            for a in addrs:
                try:
                    check_peer_address(a)
                except ValueError as e:
                    raise OptionsError(f"failed to resolve {flag} ({a}) - {e}") from None
        if self.http_client_auth_secret_file:
            auth_secret(self)  # an unreadable or empty file stops nsqadmin at start
        if self.proxy_graphite and not self.graphite_url:
            raise OptionsError(f"failed to parse --graphite-url ({self.graphite_url}) - empty")
        if self.allow_config_from_cidr:
            try:
                ipaddress.ip_network(self.allow_config_from_cidr, strict=False)
            except ValueError as e:
                raise OptionsError(f"failed to parse --allow-config-from-cidr "
                                   f"({self.allow_config_from_cidr}) - {e}") from None
        if self.stats_sample_interval < 0 or self.stats_sample_window < 0:
            raise OptionsError("--stats-sample-interval and --stats-sample-window must be >= 0")
        self.base_path = normalize_base_path(self.base_path)


def auth_secret(opts: Options) -> str:
    """The secret of ``--http-client-auth-secret-file`` ("" without one); OptionsError if
    the file cannot be read or is empty."""
    if not opts.http_client_auth_secret_file:
        return ""
    try:
        with open(opts.http_client_auth_secret_file, encoding="utf-8") as f:
            secret = f.read().strip()
    except (OSError, UnicodeDecodeError) as e:
        raise OptionsError(f"--http-client-auth-secret-file: {e}") from None
    if not secret:
        raise OptionsError(f"--http-client-auth-secret-file {opts.http_client_auth_secret_file}"
                           " is empty")
    return secret


def _flags() -> list[Flag]:
    d = Options()
    return [
        *basic_flags(d.log_prefix),
        listen_flag("http-address", d.http_address, "<addr>:<port> to listen on for HTTP clients"),
        Flag("base-path", "string", d.base_path, "URL base path"),
        Flag("dev-static-dir", "string", "", "(development use only)"),
        Flag("graphite-url", "string", "", "graphite HTTP address"),
        Flag("proxy-graphite", "bool", False, "proxy HTTP requests to graphite"),
        Flag("statsd-counter-format", "string", d.statsd_counter_format,
             "The counter stats key formatting applied by the implementation of statsd. "
             "If no formatting is desired, set this to an empty string."),
        Flag("statsd-gauge-format", "string", d.statsd_gauge_format,
             "The gauge stats key formatting applied by the implementation of statsd. "
             "If no formatting is desired, set this to an empty string."),
        Flag("statsd-prefix", "string", d.statsd_prefix,
             "prefix used for keys sent to statsd (%s for host replacement, must match nsqd)"),
        Flag("statsd-interval", "duration", d.statsd_interval,
             "time interval nsqd is configured to push to statsd (must match nsqd)"),
        Flag("notification-http-endpoint", "string", "",
             "HTTP endpoint (fully qualified) to which POST notifications of admin actions "
             "will be sent"),
        *http_client_flags(d.http_client_connect_timeout, d.http_client_request_timeout),
        Flag("http-client-tls-insecure-skip-verify", "bool", False,
             "configure the HTTP client to skip verification of TLS certificates"),
        Flag("http-client-tls-root-ca-file", "string", "", "path to CA file for the HTTP client"),
        Flag("http-client-tls-cert", "string", "",
             "path to certificate file for the HTTP client"),
        Flag("http-client-tls-key", "string", "", "path to key file for the HTTP client"),
        Flag("http-client-auth-secret-file", "string", "",
             "[nsqx] file holding the secret sent to nsqd and nsqlookupd as 'Authorization: "
             "Bearer SECRET' (for nodes with --auth-http-address: grant it the permissions "
             "of the actions nsqadmin's users may take)"),
        Flag("allow-config-from-cidr", "string", d.allow_config_from_cidr,
             "A CIDR from which to allow HTTP requests to the /config endpoint"),
        Flag("acl-http-header", "string", d.acl_http_header,
             "HTTP header to check for authenticated admin users"),
        peer_flag("lookupd-http-address", "lookupd HTTP address (may be given multiple times)",
                  dest="nsqlookupd_http_addresses"),
        peer_flag("nsqd-http-address", "nsqd HTTP address (may be given multiple times)",
                  dest="nsqd_http_addresses"),
        Flag("admin-user", "strings", [],
             "admin user (may be given multiple times; if specified, only these users will be "
             "able to perform privileged actions; acl-http-header is used to determine the "
             "authenticated user)", dest="admin_users", cfg="admin_users"),
        Flag("stats-sample-interval", "duration", d.stats_sample_interval,
             "nsqx: how often nsqadmin samples /stats of every nsqd for its built-in graphs "
             "(0 disables them)"),
        Flag("stats-sample-window", "duration", d.stats_sample_window,
             "nsqx: how much history the built-in graphs keep in memory"),
    ]


PROGRAM = Program("nsqadmin", Options, _flags, (OptionsError,))


# the module's API (the entry point and the server use these names)
flag_set = PROGRAM.flag_set
version_string = PROGRAM.version
load = PROGRAM.load  # argv (+ --config) -> (validated Options, extras {help, version})
parse_args = PROGRAM.parse_args  # exits 0 after --help/--version, 2 on a bad flag
