"""nsqd options: upstream defaults, Go and GNU flag syntaxes, TOML config, errors, --help."""

from __future__ import annotations

import os
import platform
from pathlib import Path

import pytest

from nsqx import NSQ_VERSION, __version__
from nsqx.flags import (
    FlagError,
    format_go_duration,
    parse_go_bool,
    parse_go_duration,
    parse_go_int,
)
from nsqx.nsqd.options import (
    TLS_NOT_REQUIRED,
    TLS_REQUIRED,
    TLS_REQUIRED_EXCEPT_HTTP,
    Options,
    OptionsError,
    flag_set,
    load,
    parse_args,
)

# upstream nsqd.NewOptions() (nsqio/nsq 1.3.0), durations in seconds
UPSTREAM_DEFAULTS = {
    "log_level": "info",
    "log_prefix": "[nsqd] ",
    "tcp_address": "0.0.0.0:4150",
    "http_address": "0.0.0.0:4151",
    "https_address": "0.0.0.0:4152",
    "broadcast_tcp_port": 0,
    "broadcast_http_port": 0,
    "nsqlookupd_tcp_addresses": [],
    "auth_http_addresses": [],
    "auth_http_request_method": "get",
    "http_client_connect_timeout": 2.0,
    "http_client_request_timeout": 5.0,
    "topology_region": "",
    "topology_zone": "",
    "mem_queue_size": 10000,
    "max_bytes_per_file": 104857600,
    "sync_every": 2500,
    "sync_timeout": 2.0,
    "queue_scan_interval": 0.1,
    "queue_scan_refresh_interval": 5.0,
    "queue_scan_selection_count": 20,
    "queue_scan_worker_pool_max": 4,
    "queue_scan_dirty_percent": 0.25,
    "msg_timeout": 60.0,
    "max_msg_timeout": 900.0,
    "max_msg_size": 1048576,
    "max_body_size": 5242880,
    "max_req_timeout": 3600.0,
    "client_timeout": 60.0,
    "max_heartbeat_interval": 60.0,
    "max_rdy_count": 2500,
    "max_output_buffer_size": 65536,
    "max_output_buffer_timeout": 30.0,
    "min_output_buffer_timeout": 0.025,
    "output_buffer_timeout": 0.25,
    "max_channel_consumers": 0,
    "statsd_address": "",
    "statsd_prefix": "nsq.%s",
    "statsd_interval": 60.0,
    "statsd_mem_stats": True,
    "statsd_udp_packet_size": 508,
    "statsd_exclude_ephemeral": False,
    "e2e_processing_latency_window_time": 600.0,
    "e2e_processing_latency_percentiles": [],
    "tls_cert": "",
    "tls_key": "",
    "tls_client_auth_policy": "",
    "tls_root_ca_file": "",
    "tls_required": TLS_NOT_REQUIRED,
    "tls_min_version": "tls1.0",
    "deflate": True,
    "max_deflate_level": 6,
    "snappy": True,
    "enable_experiment": [],
}

UPSTREAM_FLAGS = (
    "version", "config", "log-level", "log-prefix", "verbose", "node-id", "worker-id",
    "https-address", "http-address", "tcp-address", "auth-http-address",
    "auth-http-request-method", "broadcast-address", "broadcast-tcp-port", "broadcast-http-port",
    "lookupd-tcp-address", "http-client-connect-timeout", "http-client-request-timeout",
    "topology-region", "topology-zone", "data-path", "mem-queue-size", "max-bytes-per-file",
    "sync-every", "sync-timeout", "queue-scan-worker-pool-max", "queue-scan-selection-count",
    "msg-timeout", "max-msg-timeout", "max-msg-size", "max-req-timeout", "max-body-size",
    "max-heartbeat-interval", "max-rdy-count", "max-output-buffer-size",
    "max-output-buffer-timeout", "min-output-buffer-timeout", "output-buffer-timeout",
    "max-channel-consumers", "statsd-address", "statsd-interval", "statsd-mem-stats",
    "statsd-prefix", "statsd-udp-packet-size", "statsd-exclude-ephemeral",
    "e2e-processing-latency-percentile", "e2e-processing-latency-window-time", "tls-cert",
    "tls-key", "tls-client-auth-policy", "tls-root-ca-file", "tls-required", "tls-min-version",
    "deflate", "max-deflate-level", "snappy", "enable-experiment",
)


def opts(*argv: str) -> Options:
    return load(list(argv))[0]


def test_defaults_match_upstream() -> None:
    o = parse_args([])
    for name, value in UPSTREAM_DEFAULTS.items():
        assert getattr(o, name) == value, name
    assert o.data_path == os.getcwd()
    assert 0 <= o.node_id < 1024
    assert o.broadcast_address  # the OS hostname
    assert o.node_id == Options().node_id  # stable: crc32(md5(hostname)) % 1024


def test_every_upstream_flag_exists() -> None:
    names = {f.name for f in flag_set()}
    assert set(UPSTREAM_FLAGS) <= names


def test_flags_beyond_upstream_are_marked_as_nsqx_own() -> None:
    """--help tells upstream's flags from nsqx's own (issue 30 item 7: --archive-* were not)."""
    unmarked = [f.name for f in flag_set()
                if f.name not in UPSTREAM_FLAGS and not f.help.startswith("[nsqx] ")]
    assert unmarked == []
    listed = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text()
    assert [f.name for f in flag_set() if f.help.startswith("[nsqx] ")
            and f"`--{f.name}`" not in listed] == []  # its "Flags beyond upstream"


@pytest.mark.parametrize("argv", [
    ["-msg-timeout=30s", "-max-rdy-count=10"],
    ["-msg-timeout", "30s", "-max-rdy-count", "10"],
    ["--msg-timeout=30s", "--max-rdy-count=10"],
    ["--msg-timeout", "30s", "--max-rdy-count", "10"],
])
def test_go_and_gnu_syntaxes(argv: list[str]) -> None:
    o = opts(*argv)
    assert o.msg_timeout == 30.0 and o.max_rdy_count == 10


def test_booleans() -> None:
    assert opts("--snappy=false").snappy is False
    assert opts("-deflate=0").deflate is False
    assert opts("--statsd-exclude-ephemeral").statsd_exclude_ephemeral is True
    assert opts("--statsd-mem-stats=F").statsd_mem_stats is False
    with pytest.raises(FlagError):
        opts("--snappy=nope")


def test_tls_required_values() -> None:
    tls = ("--tls-cert=c.pem", "--tls-key=k.pem")
    assert opts(*tls, "--tls-required").tls_required == TLS_REQUIRED
    assert opts(*tls, "--tls-required=true").tls_required == TLS_REQUIRED
    assert opts(*tls, "--tls-required=tcp-https").tls_required == TLS_REQUIRED_EXCEPT_HTTP
    assert opts(*tls, "--tls-required=TCP-HTTPS").tls_required == TLS_REQUIRED_EXCEPT_HTTP
    assert opts("--tls-required=false").tls_required == TLS_NOT_REQUIRED
    # a client auth policy implies TLS required (upstream nsqd.New)
    assert opts(*tls, "--tls-client-auth-policy=require").tls_required == TLS_REQUIRED
    with pytest.raises(FlagError):
        opts("--tls-required=maybe")
    with pytest.raises(OptionsError, match="without TLS key and cert"):
        opts("--tls-required")


def test_repeatable_and_list_flags() -> None:
    o = opts("--lookupd-tcp-address=a:4160", "-lookupd-tcp-address", "b:4160",
             "--auth-http-address=http://auth/x",
             "--e2e-processing-latency-percentile=0.5,0.99",
             "--e2e-processing-latency-percentile", "1.0",
             "--enable-experiment=topology-aware-consumption")
    assert o.nsqlookupd_tcp_addresses == ["a:4160", "b:4160"]
    assert o.auth_http_addresses == ["http://auth/x"]
    assert o.e2e_processing_latency_percentiles == [1.0, 0.99, 0.5]  # upstream sorts, desc
    assert o.has_experiment("topology-aware-consumption")


def test_durations() -> None:
    assert parse_go_duration("1h") == 3600.0
    assert parse_go_duration("2m30s") == 150.0
    assert parse_go_duration("250ms") == 0.25
    assert parse_go_duration("1.5h") == 5400.0
    assert parse_go_duration("10us") == pytest.approx(1e-5)
    assert parse_go_duration("0") == 0.0
    for bad in ("60", "", "1d", "s", "1h 2m", "abc"):
        with pytest.raises(FlagError):
            parse_go_duration(bad)
    assert format_go_duration(60) == "1m0s"
    assert format_go_duration(3600) == "1h0m0s"
    assert format_go_duration(0.25) == "250ms"
    assert format_go_duration(0.025) == "25ms"
    assert format_go_duration(0) == "0s"
    assert format_go_duration(90.5) == "1m30.5s"
    assert format_go_duration(0, ns=1500) == "1.5\u00b5s"


def test_go_scalars() -> None:
    assert parse_go_int("0x10") == 16 and parse_go_int("-5") == -5 and parse_go_int("010") == 8
    assert parse_go_bool("T") is True and parse_go_bool("0") is False
    for bad in ("1.5", "", "ten", "9223372036854775808"):
        with pytest.raises(FlagError):
            parse_go_int(bad)


def test_validation() -> None:
    for argv, msg in [
        (["--max-deflate-level=0"], "max-deflate-level"),
        (["--max-deflate-level=10"], "max-deflate-level"),
        (["--node-id=1024"], "node-id"),
        (["--node-id=-1"], "node-id"),
        (["--e2e-processing-latency-percentile=0"], "percentile"),
        (["--e2e-processing-latency-percentile=1.5"], "percentile"),
        (["--auth-http-request-method=put"], "post or get"),
        (["--enable-experiment=warp-drive"], "experiment"),
        (["--tls-client-auth-policy=sometimes"], "auth-policy"),
        (["--max-attempts=-1"], "max-attempts must not be negative"),
        (["--max-attempts=65536"], "max-attempts must be <= 65535"),
        (["--msg-ttl=-1s"], "msg-ttl must not be negative"),
        (["--msg-ttl=8785h"], "msg-ttl must be <= 8784h0m0s"),
    ]:
        with pytest.raises(OptionsError, match=msg):
            opts(*argv)
    with pytest.raises(FlagError, match="tlsVersionOption"):
        opts("--tls-min-version=ssl3.0")
    assert opts("--tls-min-version=TLS1.2").tls_min_version == "tls1.2"
    assert opts("--node-id=1023").node_id == 1023
    assert opts("--max-attempts=65535", "--msg-ttl=8784h").max_attempts == 65535
    with pytest.raises(FlagError):
        opts("--max-attempts=three")
    assert opts("--log-level=WARN").log_level == "warn"
    with pytest.raises(FlagError, match="invalid log level"):
        opts("--log-level=loud")


def test_bad_flags_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["--no-such-flag"], ["--msg-timeout"], ["--msg-timeout=60"],
                 ["--max-rdy-count=ten"], ["stray"], ["--max-deflate-level=12"], ["---x"]):
        with pytest.raises(SystemExit) as exc:
            parse_args(argv)
        assert exc.value.code == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("nsqd: ") and "Traceback" not in err
    with pytest.raises(SystemExit):
        parse_args(["--no-such-flag=1"])
    assert "flag provided but not defined: -no-such-flag" in capsys.readouterr().err


def test_help_lists_every_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_args(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("Usage of nsqd:\n")
    for name in UPSTREAM_FLAGS:
        assert f"\n  -{name}" in out, name
    assert "  -msg-timeout duration\n    \tdefault duration to wait before auto-requeing a " \
           "message (default 1m0s)\n" in out
    assert '  -tcp-address string\n' in out and '(default "0.0.0.0:4150")' in out
    assert "  -deflate\n" in out and "(default true)" in out
    assert "(default 2500)" in out
    assert "  -max-attempts int\n" in out and "<topic>.dlq" in out
    assert "  -msg-ttl duration\n" in out and "/topic/config" in out
    for flag in ("-h", "-help"):
        with pytest.raises(SystemExit):
            parse_args([flag])
        assert capsys.readouterr().out == out


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_args(["-version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out == (
        f"nsqd v{NSQ_VERSION} (built w/python{platform.python_version()}) nsqx/{__version__}\n"
    )


def test_toml_config(tmp_path: Path) -> None:
    cfg = tmp_path / "nsqd.cfg"
    cfg.write_text("""
id = 42
msg_timeout = "30s"
max_req_timeout = 1500          # a bare number is milliseconds (go-options)
nsqlookupd_tcp_addresses = ["l1:4160", "l2:4160"]
e2e_processing_latency_percentiles = [0.5, 1.0]
snappy = false
tls_required = "tcp-https"
tls_cert = "c"
tls_key = "k"
tls_min_version = "tls1.2"
log_level = "debug"
max_rdy_count = 10
data_path = "/var/lib/nsq"
statsd_prefix = "custom.%s"
""")
    o = opts("--config", str(cfg))
    assert o.node_id == 42
    assert o.msg_timeout == 30.0
    assert o.max_req_timeout == 1.5
    assert o.nsqlookupd_tcp_addresses == ["l1:4160", "l2:4160"]
    assert o.e2e_processing_latency_percentiles == [1.0, 0.5]
    assert o.snappy is False
    assert o.tls_required == TLS_REQUIRED_EXCEPT_HTTP
    assert o.tls_min_version == "tls1.2"
    assert o.log_level == "debug"
    assert o.data_path == "/var/lib/nsq"
    # the command line wins over the file
    o = opts(f"--config={cfg}", "--max-rdy-count=99", "--lookupd-tcp-address=cli:4160",
             "-snappy=true")
    assert o.max_rdy_count == 99 and o.nsqlookupd_tcp_addresses == ["cli:4160"] and o.snappy


def test_toml_tls_required_bool_and_comma_lists(tmp_path: Path) -> None:
    cfg = tmp_path / "a.toml"
    cfg.write_text('tls_required = true\ntls_cert = "c"\ntls_key = "k"\n'
                   'nsqlookupd_tcp_addresses = "a:1,b:2"\n'
                   'e2e_processing_latency_percentiles = "0.99,0.95"\n')
    o = opts("--config", str(cfg))
    assert o.tls_required == TLS_REQUIRED
    assert o.nsqlookupd_tcp_addresses == ["a:1", "b:2"]
    assert o.e2e_processing_latency_percentiles == [0.99, 0.95]


def test_toml_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.toml"
    for text in ('msg_timeout = "soon"', "max_rdy_count = \"many\"", "snappy = [1]",
                 "this is not toml", "max_deflate_level = 0"):
        bad.write_text(text)
        with pytest.raises(SystemExit) as exc:
            parse_args(["--config", str(bad)])
        assert exc.value.code == 2, text
        assert "nsqd: " in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_args(["--config", str(tmp_path / "missing.toml")])
    assert "failed to load config file" in capsys.readouterr().err
    bad.write_text("no_such_option = 1\n")
    assert opts("--config", str(bad)).max_rdy_count == 2500
    assert "unknown option 'no_such_option'" in capsys.readouterr().err


def test_go_value_for_config_endpoint() -> None:
    o = Options(node_id=3)
    assert o.go_value("id") == 3
    assert o.go_value("msg_timeout") == 60_000_000_000
    assert o.go_value("min_output_buffer_timeout") == 25_000_000
    assert o.go_value("log_level") == 2
    assert o.go_value("tls_min_version") == 0x0301
    assert o.go_value("nsqlookupd_tcp_addresses") == []
    for bad in ("node_id", "version", "config", "queue_scan_interval", "x"):
        with pytest.raises(KeyError):
            o.go_value(bad)
