"""Server-rendered HTML pages of nsqadmin. Everything interpolated is escaped; the pages
carry no inline script or style (the Content-Security-Policy forbids them): behaviour is in
``static/app.js``, looks in ``static/app.css``; data for the script sits in ``data-*``
attributes.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from html import escape
from typing import Any
from urllib.parse import quote

__all__ = ["Ctx", "render_channel", "render_cluster", "render_counter", "render_error",
           "render_lookup", "render_messages", "render_node", "render_nodes", "render_topic",
           "render_topics", "render_trace"]


def e(v: Any) -> str:
    return escape(str(v), quote=True)


def q(v: str) -> str:
    return quote(v, safe="")


def num(v: Any) -> str:
    """commafy: 1234567 -> 1,234,567."""
    try:
        return f"{int(v):,}"
    except (TypeError, ValueError):
        return e(v)


def rate(v: float | None) -> str:
    if v is None:
        return "–"
    if v >= 100:
        return f"{v:,.0f}"
    return f"{v:,.1f}"


def nanos(v: float) -> str:
    """nanotohuman: 1500000 -> 1.5ms."""
    v = float(v)
    for unit, div in (("s", 1e9), ("ms", 1e6), ("us", 1e3)):
        if v >= div:
            return f"{v / div:.1f}{unit}"
    return f"{v:.0f}ns"


def since(ts: int, now: float) -> str:
    d = max(0, int(now) - int(ts))
    if d < 60:
        return f"{d}s"
    if d < 3600:
        return f"{d // 60}m {d % 60}s"
    if d < 86400:
        return f"{d // 3600}h {(d % 3600) // 60}m"
    return f"{d // 86400}d {(d % 86400) // 3600}h"


def pct_label(qv: float) -> str:
    p = qv * 100
    return (f"{p:g}") + "th"


class Ctx:
    """What every page needs: paths, the user's rights, warnings, down nodes."""

    def __init__(self, *, base_path: str, version: str, is_admin: bool, lookupd: list[str],
                 messages: list[str], down: list[Any], graphite: dict[str, Any],
                 sample_interval: float, csrf_cookie: str) -> None:
        self.base = "" if base_path == "/" else base_path
        self.version = version
        self.is_admin = is_admin
        self.lookupd = lookupd
        self.messages = messages
        self.down = down
        self.graphite = graphite
        self.sample_interval = sample_interval
        self.csrf_cookie = csrf_cookie

    def url(self, path: str) -> str:
        return e(self.base + path)


def _nav(ctx: Ctx, active: str) -> str:
    items = [("streams", "/", "Streams"), ("nodes", "/nodes", "Nodes"),
             ("counter", "/counter", "Counter"), ("lookup", "/lookup", "Lookup"),
             ("messages", "/messages", "Messages"), ("trace", "/trace", "Trace"),
             ("cluster", "/cluster", "Cluster")]
    links = "".join(
        f'<a class="nav-link{" active" if k == active else ""}" href="{ctx.url(p)}">{t}</a>'
        for k, p, t in items)
    return (f'<header class="topbar"><a class="brand" href="{ctx.url("/")}">nsqadmin</a>'
            f'<nav class="nav">{links}</nav>'
            f'<span class="version">v{e(ctx.version)}</span></header>')


def _alerts(ctx: Ctx) -> str:
    out = []
    if ctx.down:
        items = "".join(
            f'<li><strong>{e(d.kind)} {e(d.address)}</strong> is down: {e(d.error)}</li>'
            for d in ctx.down)
        out.append(f'<div class="alert alert-danger" id="down-nodes" role="alert">'
                   f'<strong>{len(ctx.down)} node(s) unreachable</strong> — showing what the '
                   f'other nodes report.<ul>{items}</ul></div>')
    for m in ctx.messages:
        if m:
            out.append(f'<div class="alert alert-warning" role="alert">{e(m)}</div>')
    out.append('<div class="alert alert-danger hidden" id="flash" role="alert"></div>')
    return "".join(out)


def layout(ctx: Ctx, title: str, active: str, body: str, *, page: str) -> str:
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{e(title)} · nsqadmin</title>"
        f'<link rel="icon" type="image/svg+xml" href="{ctx.url("/static/favicon.svg")}">'
        f'<link rel="stylesheet" href="{ctx.url("/static/app.css")}">'
        f'<script defer src="{ctx.url("/static/app.js")}"></script>'
        "</head>"
        f'<body data-base-path="{e(ctx.base)}" data-page="{e(page)}" '
        f'data-admin="{"1" if ctx.is_admin else "0"}" '
        f'data-sample-interval="{ctx.sample_interval:g}" '
        f'data-csrf-cookie="{e(ctx.csrf_cookie)}">'
        f"{_nav(ctx, active)}<main class=\"container\">{_alerts(ctx)}{body}</main>"
        f'<footer class="footer">nsqadmin (nsqx) v{e(ctx.version)}</footer>'
        "</body></html>"
    )


def _breadcrumb(ctx: Ctx, parts: list[tuple[str, str | None]]) -> str:
    items = []
    for text, href in parts:
        if href is None:
            items.append(f'<li class="active">{e(text)}</li>')
        else:
            items.append(f'<li><a href="{ctx.url(href)}">{e(text)}</a></li>')
    return f'<ol class="breadcrumb">{"".join(items)}</ol>'


def _btn(label: str, cls: str, attrs: dict[str, str]) -> str:
    a = " ".join(f'data-{k}="{e(v)}"' for k, v in attrs.items())
    return f'<button type="button" class="btn {cls}" {a}>{e(label)}</button>'


def _paused(p: bool) -> str:
    return ' <span class="badge badge-paused">paused</span>' if p else ""


def _create_form(ctx: Ctx, topic: str | None = None) -> str:
    if not ctx.is_admin:
        return ""
    if topic is None:
        fields = ('<input name="topic" placeholder="topic name" required '
                  'pattern="[.a-zA-Z0-9_\\-]+(#ephemeral)?" maxlength="64" aria-label="topic">'
                  '<input name="channel" placeholder="channel (optional)" '
                  'pattern="[.a-zA-Z0-9_\\-]+(#ephemeral)?" maxlength="64" aria-label="channel">')
        title = "Create Topic / Channel"
    else:
        fields = (f'<input type="hidden" name="topic" value="{e(topic)}">'
                  '<input name="channel" placeholder="channel name" required '
                  'pattern="[.a-zA-Z0-9_\\-]+(#ephemeral)?" maxlength="64" aria-label="channel">')
        title = "Create Channel"
    return (f'<form class="create-form card" id="create-form"><h4>{title}</h4>'
            f'<div class="form-row">{fields}'
            '<button type="submit" class="btn btn-primary">Create</button></div></form>')


def _chart(ctx: Ctx, src: str, metric: str, title: str, cls: str = "") -> str:
    return (f'<figure class="chart {cls}" data-src="{ctx.url(src)}" data-metric="{e(metric)}">'
            f'<figcaption>{e(title)}</figcaption><div class="chart-body">'
            '<span class="muted">collecting samples…</span></div></figure>')


def _graphite_img(ctx: Ctx, target: str, title: str) -> str:
    g = ctx.graphite
    if not g.get("enabled"):
        return ""
    base = ctx.base + "/render" if g.get("proxy") else g["url"].rstrip("/") + "/render"
    src = (f"{base}?target={q(target)}&from=-2h&width=420&height=160&hideLegend=true"
           f"&title={q(title)}")
    return (f'<figure class="chart graphite"><figcaption>{e(title)} (graphite)</figcaption>'
            f'<img alt="{e(title)}" src="{e(src)}" width="420" height="160"></figure>')


def _statsd_target(ctx: Ctx, typ: str, topic: str, channel: str, key: str) -> str:
    g = ctx.graphite
    prefix = g["statsd_prefix"].replace("%s", "*")
    if not prefix.endswith("."):
        prefix += "."
    gauge = key in ("depth", "in_flight_count", "deferred_count", "clients")
    fmt = g["statsd_gauge_format"] if gauge else g["statsd_counter_format"]
    k = prefix + "topic." + topic + (f".channel.{channel}" if typ == "channel" else "") + "." + key
    full = fmt.replace("%s", k) if fmt else k
    return f"sumSeries({full})"


def _e2e_headers(e2e: dict[str, Any] | None) -> tuple[str, list[dict[str, Any]]]:
    pcts = (e2e or {}).get("percentiles") or []
    return "".join(f"<th>e2e {e(pct_label(p['quantile']))}</th>" for p in pcts), pcts


def _e2e_cells(e2e: dict[str, Any] | None, pcts: list[dict[str, Any]]) -> str:
    mine = {p["quantile"]: p for p in (e2e or {}).get("percentiles") or []}
    out = []
    for p in pcts:
        m = mine.get(p["quantile"])
        if m is None:
            out.append("<td>–</td>")
        else:
            out.append(f'<td title="min {e(nanos(m["min"]))}, max {e(nanos(m["max"]))}">'
                       f'{e(nanos(m["average"]))}</td>')
    return "".join(out)


def _cell(metric: str, v: Any) -> str:
    return f'<td class="num" data-metric="{metric}" data-value="{int(v)}">{num(v)}</td>'


def _channel_cells(c: dict[str, Any], extra: tuple[str, ...] = ()) -> str:
    """A channel row's counters: depth (memory + disk), in flight, deferred, requeued, timed
    out, the ``extra`` ones (0 when absent), messages, clients."""
    return (f'{_cell("depth", c["depth"])}'
            f'<td class="num muted">{num(c["memory_depth"])} + {num(c["backend_depth"])}</td>'
            + "".join(_cell(k, c[k]) for k in ("in_flight_count", "deferred_count",
                                               "requeue_count", "timeout_count"))
            + "".join(_cell(k, c.get(k, 0)) for k in extra)
            + _cell("message_count", c["message_count"]) + _cell("client_count", c["client_count"]))


# ------------------------------------------------------------------------- Streams (/topics)

def render_topics(ctx: Ctx, rows: list[dict[str, Any]], rates: dict[str, float],
                  inactive: Iterable[str]) -> str:
    """rows: aggregated TopicStats (plus ``in_flight_count``/``channel_depth`` sums)."""
    body = [f'<div class="page-head"><h2>Streams <span class="count">{len(rows)}</span></h2>'
            '<input type="search" id="filter" class="filter" placeholder="filter topics…" '
            'aria-label="filter topics"></div>']
    if not rows:
        body.append('<div class="alert alert-info">No topics found.</div>')
    else:
        trs = []
        for t in rows:
            name = t["topic_name"]
            href = ctx.url("/topics/" + q(name))
            trs.append(
                f'<tr data-topic="{e(name)}"><td class="name"><a href="{href}">{e(name)}</a>'
                f'{_paused(t.get("paused"))}</td>'
                f'<td class="num">{len(t["nodes"])}</td>'
                f'<td class="num">{len(t["channels"])}</td>'
                f'{_cell("depth", t["depth"])}'
                f'<td class="num muted">{num(t["memory_depth"])} + {num(t["backend_depth"])}</td>'
                f'{_cell("channel_depth", t["channel_depth"])}'
                f'{_cell("in_flight_count", t["in_flight_count"])}'
                f'{_cell("message_count", t["message_count"])}'
                f'<td class="num" data-metric="rate">{rate(rates.get(name))}</td></tr>')
        body.append(
            '<div class="table-wrap"><table class="table" id="topics-table"><thead><tr>'
            '<th>Topic</th><th class="num">Nodes</th><th class="num">Channels</th>'
            '<th class="num">Depth</th><th class="num">Memory + Disk</th>'
            '<th class="num" title="sum of the depths of its channels">Channel Depth</th>'
            '<th class="num">In-Flight</th><th class="num">Messages</th>'
            '<th class="num">Rate/s</th></tr></thead><tbody>'
            + "".join(trs) + "</tbody></table></div>")
    inactive = list(inactive)
    if inactive:
        links = " ".join(f'<a class="badge" href="{ctx.url("/topics/" + q(t))}">{e(t)}</a>'
                         for t in inactive)
        body.append(f'<div class="card"><h4>Topics without producers</h4><p>{links}</p></div>')
    body.append(_create_form(ctx))
    return layout(ctx, "Streams", "streams", "".join(body), page="topics")


# ------------------------------------------------------------------------- topic

def _archive_table(rows: list[tuple[dict[str, Any], dict[str, Any]]]) -> str:
    """Tiered storage per node and partition: what the archive serves, the local log's
    start, and how far archiving lags (local deletion waits for it)."""
    trs = []
    for n, a in rows:
        err = a.get("archive_error") or ""
        trs.append(
            f'<tr data-node="{e(n["node"])}" data-partition="{e(a["partition"])}">'
            f'<td class="name">{e(n["hostname"] or n["node"])}</td>'
            f'<td class="num">{e(a["partition"])}</td>'
            f'<td class="num">{num(a["archive_start"])}</td>'
            f'<td class="num">{num(a["log_start"])}</td>'
            f'<td class="num">{num(a["archived_files"])}</td>'
            f'<td class="num">{num(a["archived_bytes"])}</td>'
            f'<td class="num">{num(a["archive_lag_segments"])} / '
            f'{num(a["archive_lag_bytes"])} B</td>'
            f'<td class="{"alert-danger" if err else "muted"}">{e(err) or "ok"}</td></tr>')
    return ('<h3>Archive <span class="muted">tiered storage: resets reach back to the '
            'archive start</span></h3><div class="table-wrap"><table class="table" '
            'id="topic-archive"><thead><tr><th>NSQd host</th><th class="num">Partition</th>'
            '<th class="num">Archive start</th><th class="num">Local log start</th>'
            '<th class="num">Files</th><th class="num">Archived bytes</th>'
            '<th class="num">Lag (segments / bytes)</th><th>Status</th></tr></thead><tbody>'
            + "".join(trs) + "</tbody></table></div>")


def render_topic(ctx: Ctx, topic: str, agg: dict[str, Any], rates: dict[str, float],
                 lookupd_mode: bool, *, cluster_topic: dict[str, Any] | None = None,
                 cluster: dict[str, Any] | None = None,
                 routes: tuple[str, dict[str, Any]] | None = None) -> str:
    body = [_breadcrumb(ctx, [("Streams", "/"), (topic, None)])]
    body.append(f'<div class="page-head"><h2>Topic <strong>{e(topic)}</strong>'
                f'{_paused(agg.get("paused"))}</h2>'
                f'<a class="muted" id="find-message" href="{ctx.url("/messages?topic=" + q(topic))}">'
                'Find a message</a></div>')
    nodes = agg.get("nodes") or []
    if ctx.is_admin and nodes:
        api = f"/api/topics/{q(topic)}"
        pause = (_btn("Unpause Topic", "btn-success", {"action": "unpause", "api": api,
                      "confirm": f"Unpause topic {topic}?"}) if agg.get("paused") else
                 _btn("Pause Topic", "btn-primary", {"action": "pause", "api": api,
                      "confirm": f"Pause topic {topic}? Every channel stops receiving."}))
        body.append(
            '<div class="actions">'
            + _btn("Empty Queue", "btn-warning", {"action": "empty", "api": api,
                   "confirm": f"Empty topic {topic}? Its queued messages are dropped."})
            + _btn("Delete Topic", "btn-danger", {"action": "delete", "api": api,
                   "confirm": f"Delete topic {topic} and all its channels?",
                   "next": ctx.base + "/"})
            + pause + "</div>")
    if not nodes:
        body.append('<div class="alert alert-info">No producers exist for this topic. See '
                    f'<a href="{ctx.url("/lookup")}">Lookup</a> for more information.</div>')
    else:
        e2e_h, pcts = _e2e_headers(agg.get("e2e_processing_latency"))
        trs = []
        for n in nodes:
            href = ctx.url("/nodes/" + q(n["node"]))
            tomb = ""
            if ctx.is_admin and lookupd_mode:
                tomb = _btn("Tombstone", "btn-xs btn-danger",
                            {"action": "tombstone", "api": f"/api/nodes/{q(n['node'])}",
                             "topic": topic,
                             "confirm": f"Tombstone topic {topic} on {n['node']}? The node "
                                        "deletes it and lookupd hides it from consumers."})
            trs.append(
                f'<tr data-node="{e(n["node"])}"><td class="name"><a href="{href}">'
                f'{e(n["hostname"] or n["node"])}</a> <span class="muted">{e(n["node"])}</span>'
                f'{_paused(n.get("paused"))}</td>'
                f'{_cell("depth", n["depth"])}'
                f'<td class="num muted">{num(n["memory_depth"])} + {num(n["backend_depth"])}</td>'
                f'{_cell("message_count", n["message_count"])}'
                f'<td class="num">{len(n["channels"])}</td>'
                f'{_e2e_cells(n.get("e2e_processing_latency"), pcts)}<td>{tomb}</td></tr>')
        trs.append(
            f'<tr class="total" data-node="*"><td>Total</td>{_cell("depth", agg["depth"])}'
            f'<td class="num muted">{num(agg["memory_depth"])} + {num(agg["backend_depth"])}</td>'
            f'{_cell("message_count", agg["message_count"])}'
            f'<td class="num">{len(agg["channels"])}</td>'
            f'{_e2e_cells(agg.get("e2e_processing_latency"), pcts)}<td></td></tr>')
        body.append(
            '<h3>Topic message queues</h3><div class="table-wrap"><table class="table" '
            'id="topic-nodes"><thead><tr><th>NSQd host</th><th class="num">Depth</th>'
            '<th class="num">Memory + Disk</th><th class="num">Messages</th>'
            f'<th class="num">Channels</th>{e2e_h}<th></th></tr></thead><tbody>'
            + "".join(trs) + "</tbody></table></div>")
    archived = [(n, a) for n in nodes for a in n.get("archive") or ()]
    if archived:
        body.append(_archive_table(archived))
    if routes is not None:
        body.append(_route_history(*routes))
        if ctx.is_admin:
            body.append(_route_forms(topic, routes[1]))
    if cluster_topic is not None:
        body.append(f'<h3>Partitions <span class="count">{len(cluster_topic["partitions"])}'
                    f'</span> <span class="muted">{e(_shape(cluster_topic))} — from '
                    f'<a href="{ctx.url("/cluster")}">the cluster</a></span></h3>')
        body.append(_partition_table(ctx, topic, cluster_topic, cluster or {}))
    body.append(_chart_row(ctx, f"/api/graphs/topics/{q(topic)}", [
        ("rate", "Messages / s"), ("depth", "Depth")]))
    if ctx.graphite.get("enabled"):
        body.append('<div class="charts">'
                    + _graphite_img(ctx, _statsd_target(ctx, "topic", topic, "", "message_count"),
                                    "messages")
                    + _graphite_img(ctx, _statsd_target(ctx, "topic", topic, "", "depth"), "depth")
                    + "</div>")
    chans = agg.get("channels") or []
    body.append(f'<h3>Channels <span class="count">{len(chans)}</span></h3>')
    if not chans:
        body.append('<div class="alert alert-info">This topic has no channels.</div>')
    else:
        e2e_h, pcts = _e2e_headers(_first_e2e(chans))
        trs = []
        for c in chans:
            name = c["channel_name"]
            href = ctx.url(f"/topics/{q(topic)}/{q(name)}")
            trs.append(
                f'<tr data-channel="{e(name)}"><td class="name"><a href="{href}">{e(name)}</a>'
                f'{_paused(c.get("paused"))}</td>'
                f'{_channel_cells(c)}'
                f'{_e2e_cells(c.get("e2e_processing_latency"), pcts)}</tr>')
        body.append(
            '<div class="table-wrap"><table class="table" id="topic-channels"><thead><tr>'
            '<th>Channel</th><th class="num">Depth</th><th class="num">Memory + Disk</th>'
            '<th class="num">In-Flight</th><th class="num">Deferred</th>'
            '<th class="num">Requeued</th><th class="num">Timed Out</th>'
            '<th class="num">Messages</th><th class="num">Connections</th>'
            f'{e2e_h}</tr></thead><tbody>' + "".join(trs) + "</tbody></table></div>")
    if nodes:
        body.append(_create_form(ctx, topic))
    return layout(ctx, f"Topic {topic}", "streams", "".join(body), page="topic")


def _first_e2e(items: list[dict[str, Any]]) -> dict[str, Any] | None:
    for c in items:
        if (c.get("e2e_processing_latency") or {}).get("percentiles"):
            return c["e2e_processing_latency"]
    return None


def _chart_row(ctx: Ctx, src: str, charts: list[tuple[str, str]]) -> str:
    if not ctx.sample_interval:
        return ""
    return ('<div class="charts">'
            + "".join(_chart(ctx, f"{src}?metric={m}", m, t) for m, t in charts) + "</div>")


# ------------------------------------------------------------------------- channel

def render_channel(ctx: Ctx, topic: str, channel: str, agg: dict[str, Any] | None) -> str:
    body = [_breadcrumb(ctx, [("Streams", "/"), (topic, "/topics/" + q(topic)), (channel, None)])]
    paused = bool(agg and agg.get("paused"))
    body.append(f'<div class="page-head"><h2>Channel <strong>{e(topic)}</strong> / '
                f'<strong>{e(channel)}</strong>{_paused(paused)}</h2></div>')
    nodes = (agg or {}).get("nodes") or []
    if not nodes:
        body.append('<div class="alert alert-info">No producers exist for this topic/channel. '
                    f'See <a href="{ctx.url("/lookup")}">Lookup</a> for more information.</div>')
        return layout(ctx, f"Channel {topic}/{channel}", "streams", "".join(body), page="channel")
    assert agg is not None
    if ctx.is_admin:
        api = f"/api/topics/{q(topic)}/{q(channel)}"
        pause = (_btn("Unpause Channel", "btn-success", {"action": "unpause", "api": api,
                      "confirm": f"Unpause channel {channel}?"}) if paused else
                 _btn("Pause Channel", "btn-primary", {"action": "pause", "api": api,
                      "confirm": f"Pause channel {channel}? Its clients stop receiving."}))
        body.append(
            '<div class="actions">'
            + _btn("Empty Queue", "btn-warning", {"action": "empty", "api": api,
                   "confirm": f"Empty channel {channel}? Its queued and in-flight messages "
                              "are dropped."})
            + _btn("Delete Channel", "btn-danger", {"action": "delete", "api": api,
                   "confirm": f"Delete channel {channel}?",
                   "next": ctx.base + "/topics/" + q(topic)})
            + pause + "</div>")
        body.append(_reset_form(topic, channel, nodes))
    e2e_h, pcts = _e2e_headers(agg.get("e2e_processing_latency"))

    def row(c: dict[str, Any], label: str, key: str, cls: str = "") -> str:
        return (f'<tr class="{cls}" data-node="{e(key)}"><td class="name">{label}'
                f'{_paused(c.get("paused")) if key != "*" else ""}</td>'
                f'{_channel_cells(c, ("dlq_count", "expired_count"))}'
                f'{_e2e_cells(c.get("e2e_processing_latency"), pcts)}</tr>')

    trs = [row(n, f'<a href="{ctx.url("/nodes/" + q(n["node"]))}">{e(n["hostname"] or n["node"])}'
                  f'</a> <span class="muted">{e(n["node"])}</span>', n["node"]) for n in nodes]
    trs.append(row(agg, "Total", "*", "total"))
    body.append(
        '<div class="table-wrap"><table class="table" id="channel-nodes"><thead><tr>'
        '<th>NSQd host</th><th class="num">Depth</th><th class="num">Memory + Disk</th>'
        '<th class="num">In-Flight</th><th class="num">Deferred</th><th class="num">Requeued</th>'
        '<th class="num">Timed Out</th><th class="num" title="moved to the dead-letter topic '
        'after --max-attempts deliveries">Dead-lettered</th><th class="num" title="skipped: older '
        'than the topic TTL">Expired</th><th class="num">Messages</th>'
        f'<th class="num">Connections</th>{e2e_h}</tr></thead><tbody>'
        + "".join(trs) + "</tbody></table></div>")
    body.append(_chart_row(ctx, f"/api/graphs/topics/{q(topic)}/{q(channel)}", [
        ("rate", "Messages / s"), ("depth", "Depth"), ("in_flight_count", "In-Flight")]))
    if ctx.graphite.get("enabled"):
        body.append('<div class="charts">'
                    + _graphite_img(ctx, _statsd_target(ctx, "channel", topic, channel,
                                                        "message_count"), "messages")
                    + _graphite_img(ctx, _statsd_target(ctx, "channel", topic, channel,
                                                        "depth"), "depth")
                    + "</div>")
    clients = agg.get("clients") or []
    body.append(f'<h3>Clients <span class="count">{len(clients)}</span></h3>')
    if not clients:
        body.append('<div class="alert alert-info">No clients are connected to this '
                    'channel.</div>')
    else:
        now = time.time()
        trs = []
        for c in clients:
            attrs = []
            if c.get("tls"):
                attrs.append(f'<span class="badge badge-ok" title="{e(c.get("tls_version", ""))} '
                             f'{e(c.get("tls_cipher_suite", ""))}">TLS</span>')
            if c.get("snappy"):
                attrs.append('<span class="badge">snappy</span>')
            if c.get("deflate"):
                attrs.append('<span class="badge">deflate</span>')
            if c.get("sample_rate"):
                attrs.append(f'<span class="badge">sampled {int(c["sample_rate"])}%</span>')
            if c.get("authed"):
                ident = c.get("auth_identity") or "authed"
                url = c.get("auth_identity_url") or ""
                if url.startswith(("http://", "https://")):
                    attrs.append(f'<a class="badge badge-ok" href="{e(url)}" rel="noopener">'
                                 f'{e(ident)}</a>')
                else:
                    attrs.append(f'<span class="badge badge-ok">{e(ident)}</span>')
            host = c.get("hostname") or c.get("remote_address")
            trs.append(
                f'<tr data-client="{e(c.get("client_id", ""))}">'
                f'<td class="name">{e(host)} <span class="muted">{e(c.get("remote_address"))}'
                f'</span></td>'
                f'<td>{e(c.get("user_agent") or c.get("version"))}</td>'
                f'<td>{"".join(attrs)}</td>'
                f'<td><a href="{ctx.url("/nodes/" + q(c["node"]))}">{e(c["node"])}</a></td>'
                f'{_cell("ready_count", c["ready_count"])}'
                f'{_cell("in_flight_count", c["in_flight_count"])}'
                f'{_cell("finish_count", c["finish_count"])}'
                f'{_cell("requeue_count", c["requeue_count"])}'
                f'{_cell("message_count", c["message_count"])}'
                f'<td title="{e(time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(c["connect_ts"])))}">'
                f'{e(since(c["connect_ts"], now))}</td></tr>')
        body.append(
            '<div class="table-wrap"><table class="table" id="channel-clients"><thead><tr>'
            '<th>Client host</th><th>User agent</th><th>Attributes</th><th>NSQd host</th>'
            '<th class="num">RDY</th><th class="num">In-Flight</th><th class="num">Finished</th>'
            '<th class="num">Requeued</th><th class="num">Messages</th><th>Connected</th>'
            '</tr></thead><tbody>' + "".join(trs) + "</tbody></table></div>")
    return layout(ctx, f"Channel {topic}/{channel}", "streams", "".join(body), page="channel")


def _reset_form(topic: str, channel: str, nodes: list[dict[str, Any]]) -> str:
    """Replay / skip: move the channel to a time, an offset, the start or the end of the
    log (nsqd's /channel/setoffset through POST /api/topics/:topic/:channel)."""
    opts = '<option value="">all nodes</option>' + "".join(
        f'<option value="{e(n["node"])}">{e(n["node"])}</option>' for n in nodes)
    return (
        f'<form class="create-form card" id="reset-form" data-topic="{e(topic)}" '
        f'data-channel="{e(channel)}" data-api="/api/topics/{e(q(topic))}/{e(q(channel))}">'
        '<h4>Reset offset (replay / skip)</h4><div class="form-row">'
        '<select name="kind" aria-label="reset to">'
        '<option value="time">to a time</option><option value="offset">to an offset</option>'
        '<option value="earliest">to the oldest kept message</option>'
        '<option value="latest">to the end (skip everything)</option></select>'
        '<input name="time" type="datetime-local" step="1" aria-label="time (local)">'
        '<input name="offset" type="number" min="0" step="1" placeholder="offset" '
        'aria-label="offset" class="hidden">'
        '<input name="partition" type="number" min="0" max="65535" step="1" value="0" '
        'aria-label="partition" title="partition">'
        f'<select name="node" aria-label="node">{opts}</select>'
        '<button type="submit" class="btn btn-warning">Reset</button></div>'
        '<p class="muted">In-flight messages are forgotten; everything from the new position '
        'is delivered again. Offsets count each node\'s own log.</p></form>')


# ------------------------------------------------------------------------- messages

def render_messages(ctx: Ctx, form: dict[str, str], found: list[dict[str, Any]] | None,
                    error: str) -> str:
    """The message search: a form (topic, partition, id or offset) and what nsqd found."""
    body = ['<div class="page-head"><h2>Message search</h2></div>',
            '<form class="create-form card" id="message-search" method="get" '
            f'action="{ctx.url("/messages")}"><div class="form-row">'
            f'<input name="topic" placeholder="topic" required value="{e(form["topic"])}" '
            'pattern="[.a-zA-Z0-9_\\-]+(#ephemeral)?" maxlength="64" aria-label="topic">'
            f'<input name="id" placeholder="message id" value="{e(form["id"])}" maxlength="20" '
            'aria-label="message id">'
            f'<input name="offset" placeholder="or offset" value="{e(form["offset"])}" '
            'inputmode="numeric" maxlength="20" aria-label="offset">'
            f'<input name="partition" placeholder="partition" value="{e(form["partition"])}" '
            'inputmode="numeric" maxlength="5" aria-label="partition">'
            '<button type="submit" class="btn btn-primary">Find</button></div>'
            '<p class="muted">An id names its partition and offset; an offset needs the '
            'partition (default 0). Each node is asked.</p></form>']
    if error:
        body.append(f'<div class="alert alert-danger" id="search-error">{e(error)}</div>')
    elif found is not None and not found:
        body.append('<div class="alert alert-info" id="search-none">No node has this message '
                    '(not written yet, or removed by retention).</div>')
    for m in found or ():
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(m["timestamp"] / 1e9))
        when += f".{m['timestamp'] % 1_000_000_000:09d}"[:7] + " UTC"
        b64 = set(m.get("headers_base64") or ())
        hdrs = "".join(
            f'<tr><th>{e(k)}</th><td><code>{e(v)}</code>'
            f'{" <span class=muted>(base64)</span>" if k in b64 else ""}</td></tr>'
            for k, v in sorted((m.get("headers") or {}).items()))
        enc = ('base64 (not UTF-8)' if m.get("body_encoding") == "base64" else "text")
        body.append(
            f'<div class="card message" data-node="{e(m["node"])}" data-id="{e(m["id"])}">'
            f'<h4>{e(m["id"])} <span class="muted">on {e(m["node"])}</span></h4>'
            '<table class="table kv"><tbody>'
            f'<tr><th>Partition</th><td data-field="partition">{num(m["partition"])}</td></tr>'
            f'<tr><th>Offset</th><td data-field="offset">{num(m["offset"])}</td></tr>'
            f'<tr><th>Timestamp</th><td data-field="timestamp" data-value="{int(m["timestamp"])}">'
            f'{e(when)}</td></tr>'
            f'<tr><th>Attempts</th><td data-field="attempts">{num(m["attempts"])}</td></tr>'
            f'{hdrs}</tbody></table>'
            f'<h5>Body <span class="muted">{e(enc)}</span></h5>'
            f'<pre class="body" data-field="body">{e(m["body"])}</pre></div>')
    return layout(ctx, "Message search", "messages", "".join(body), page="messages")


# ------------------------------------------------------------------------- trace

_EVENT_BADGE = {"pub": "badge-paused", "fin": "badge-ok", "req": "badge-warn",
                "timeout": "badge-down", "dlq": "badge-down", "deliver": ""}


def _timeline(m: dict[str, Any]) -> str:
    """One message's events: a bar with a mark per event, then a table, times from the first."""
    evs = m.get("events") or []
    if not evs:
        return ('<p class="muted trace-empty">No trace events: the topic was not traced then, '
                'or they are older than the scan.</p>')
    t0, t1 = evs[0]["ts"], evs[-1]["ts"]
    span = max(t1 - t0, 1)
    marks = "".join(
        f'<span class="trace-mark badge {_EVENT_BADGE.get(ev["event"], "")}" '
        f'data-left="{100 * (ev["ts"] - t0) / span:.2f}" title="{e(ev["event"])}">'
        f'{e(ev["event"][0].upper())}</span>' for ev in evs)
    rows = []
    for ev in evs:
        client = ev.get("client") or {}
        who = e(client.get("addr") or "") + (f' <span class="muted">#{e(client["id"])}</span>'
                                               if "id" in client else "")
        extra = []
        if ev["event"] == "pub":
            extra.append(f"from {e(ev.get('producer') or '?')}")
        if "delay_ms" in ev:
            extra.append(f"delay {num(ev['delay_ms'])} ms")
        if ev.get("count", 1) > 1:
            extra.append(f"one of {num(ev['count'])} from offset {num(ev['offset'])}")
        rows.append(
            f'<tr class="trace-event" data-event="{e(ev["event"])}">'
            f'<td class="num" data-field="since">+{(ev["ts"] - t0) / 1e6:,.1f} ms</td>'
            f'<td><span class="badge {_EVENT_BADGE.get(ev["event"], "")}">{e(ev["event"])}'
            f'</span></td><td data-field="channel">{e(ev.get("channel") or "")}</td>'
            f'<td data-field="client">{who}</td>'
            f'<td class="num" data-field="attempts">{e(ev.get("attempts", ""))}</td>'
            f'<td>{"; ".join(extra)}</td><td class="muted">{e(ev.get("node") or "")}</td></tr>')
    return (f'<div class="trace-bar" title="{(t1 - t0) / 1e6:,.1f} ms from first to last event">'
            f'{marks}</div><table class="table trace-events"><thead><tr><th>time</th>'
            '<th>event</th><th>channel</th><th>client</th><th>attempts</th><th></th><th>node</th>'
            f'</tr></thead><tbody>{"".join(rows)}</tbody></table>')


def render_trace(ctx: Ctx, form: dict[str, str], found: list[dict[str, Any]] | None,
                 error: str) -> str:
    """The trace search: a form (topic and an id, a trace id or a header) and, per node that
    holds the topic, each matching message's timeline from its ``__trace`` events."""
    body = ['<div class="page-head"><h2>Message trace</h2></div>',
            '<form class="create-form card" id="trace-search" method="get" '
            f'action="{ctx.url("/trace")}"><div class="form-row">'
            f'<input name="topic" placeholder="topic" required value="{e(form["topic"])}" '
            'pattern="[.a-zA-Z0-9_\\-]+(#ephemeral)?" maxlength="64" aria-label="topic">'
            f'<input name="id" placeholder="message id" value="{e(form["id"])}" maxlength="16" '
            'aria-label="message id">'
            f'<input name="trace_id" placeholder="or trace id" value="{e(form["trace_id"])}" '
            'inputmode="numeric" maxlength="20" aria-label="trace id">'
            f'<input name="header" placeholder="or header key:value" value="{e(form["header"])}" '
            'maxlength="1000" aria-label="header">'
            '<button type="submit" class="btn btn-primary">Trace</button></div>'
            '<p class="muted">Events are recorded while a topic is traced (<code>nsqx trace '
            'enable TOPIC</code> or <code>POST /topic/trace</code>); each node is asked for the '
            'newest 200,000 events it holds.</p></form>']
    if error:
        body.append(f'<div class="alert alert-danger" id="trace-error">{e(error)}</div>')
    elif found is not None and not any(doc["messages"] for _, doc in found):
        body.append('<div class="alert alert-info" id="trace-none">No node has a matching '
                    'message.</div>')
    for node, doc in found or ():
        if not doc.get("traced"):
            body.append(f'<p class="muted trace-off" data-node="{e(node)}">Topic '
                        f'{e(doc["topic"])} is not traced on {e(node)} now.</p>')
        for m in doc["messages"]:
            hdrs = "".join(f'<span class="badge" title="header">{e(k)}: {e(v)}</span>'
                           for k, v in sorted((m.get("headers") or {}).items()))
            tid = (f' <span class="muted">trace id</span> <code data-field="trace_id">'
                   f'{e(m["trace_id"])}</code>' if "trace_id" in m else "")
            body.append(
                f'<div class="card trace" data-node="{e(node)}" data-id="{e(m["id"])}">'
                f'<h4><code>{e(m["id"])}</code>{tid} <span class="muted">partition '
                f'{num(m["partition"])}, offset {num(m["offset"])}, on {e(node)}</span></h4>'
                f'<div class="trace-headers">{hdrs}</div>{_timeline(m)}</div>')
        if doc.get("truncated"):
            body.append(f'<p class="muted">{e(node)}: scanned the newest {num(doc["scanned"])} '
                        'trace events only.</p>')
    return layout(ctx, "Message trace", "trace", "".join(body), page="trace")


# ------------------------------------------------------------------------- nodes

TOMB_TITLE = ' title="tombstoned on this node"'


def render_nodes(ctx: Ctx, producers: list[dict[str, Any]], health: dict[str, dict[str, Any]],
                 lookupds: list[dict[str, Any]]) -> str:
    body = [f'<div class="page-head"><h2>NSQd Nodes <span class="count">{len(producers)}'
            '</span></h2></div>']
    trs = []
    for p in producers:
        node = p["_node"]
        h = health.get(node, {})
        if h.get("down"):
            status = f'<span class="badge badge-down" title="{e(h.get("error", ""))}">DOWN</span>'
        elif h.get("health") and h["health"] != "OK":
            status = f'<span class="badge badge-warn">{e(h["health"])}</span>'
        else:
            status = '<span class="badge badge-ok">OK</span>'
        topics = " ".join(
            f'<a class="badge{" badge-warn" if t["tombstoned"] else ""}" '
            f'href="{ctx.url("/topics/" + q(t["topic"]))}"'
            f'{TOMB_TITLE if t["tombstoned"] else ""}>'
            f'{e(t["topic"])}</a>' for t in p["topics"][:50])
        if len(p["topics"]) > 50:
            topics += f' <span class="muted">+{len(p["topics"]) - 50} more</span>'
        conns = ""
        if ctx.lookupd:
            n = len(p["remote_addresses"])
            cls = "" if n == len(ctx.lookupd) else " badge-warn"
            conns = (f'<td class="num"><span class="badge{cls}" '
                     f'title="{e(", ".join(p["remote_addresses"]))}">{n}</span></td>')
        trs.append(
            f'<tr data-node="{e(node)}" class="{"row-down" if h.get("down") else ""}'
            f'{" row-warn" if p.get("out_of_date") else ""}">'
            f'<td class="name"><a href="{ctx.url("/nodes/" + q(node))}">{e(p["hostname"])}</a>'
            f'</td><td>{e(p["broadcast_address"])}</td><td class="num">{int(p["tcp_port"])}</td>'
            f'<td class="num">{int(p["http_port"])}</td><td>{e(p["version"])}</td>'
            f'<td>{status}</td><td>{e(p.get("topology_region", ""))}</td>'
            f'<td>{e(p.get("topology_zone", ""))}</td>{conns}'
            f'<td class="num">{len(p["topics"])}</td><td class="topics">{topics}</td></tr>')
    body.append(
        '<div class="table-wrap"><table class="table" id="nodes-table"><thead><tr>'
        '<th>Hostname</th><th>Broadcast Address</th><th class="num">TCP</th>'
        '<th class="num">HTTP</th><th>Version</th><th>Health</th><th>Region</th><th>Zone</th>'
        + ('<th class="num">Lookupd Conns.</th>' if ctx.lookupd else "")
        + '<th class="num">Topics</th><th></th></tr></thead><tbody>' + "".join(trs)
        + "</tbody></table></div>")
    if lookupds:
        rows = "".join(
            f'<tr data-lookupd="{e(lk["address"])}" class="{"" if lk["up"] else "row-down"}">'
            f'<td>{e(lk["address"])}</td><td>{e(lk["version"])}</td><td>'
            + ('<span class="badge badge-ok">OK</span>' if lk["up"] else
               f'<span class="badge badge-down" title="{e(lk["error"])}">DOWN</span>')
            + "</td></tr>" for lk in lookupds)
        body.append(
            f'<h3>nsqlookupd <span class="count">{len(lookupds)}</span></h3>'
            '<div class="table-wrap"><table class="table" id="lookupd-table"><thead><tr>'
            '<th>Address</th><th>Version</th><th>Health</th></tr></thead><tbody>'
            + rows + "</tbody></table></div>")
    return layout(ctx, "Nodes", "nodes", "".join(body), page="nodes")


def render_node(ctx: Ctx, node: str, producer: dict[str, Any] | None,
                topics: list[dict[str, Any]], down_error: str) -> str:
    body = [_breadcrumb(ctx, [("Nodes", "/nodes"), (node, None)])]
    body.append(f'<div class="page-head"><h2>Node <strong>{e(node)}</strong></h2></div>')
    if producer is None:
        body.append('<div class="alert alert-warning">This node is not known to the '
                    'cluster.</div>')
        return layout(ctx, f"Node {node}", "nodes", "".join(body), page="node")
    if down_error:
        body.append(f'<div class="alert alert-danger">This node is down: {e(down_error)}</div>')
    total_msgs = sum(t["message_count"] for t in topics)
    total_clients = sum(len(c["clients"]) for t in topics for c in t["channels"])
    body.append(
        '<div class="summary card"><dl>'
        f'<dt>Hostname</dt><dd>{e(producer["hostname"])}</dd>'
        f'<dt>Version</dt><dd>{e(producer["version"])}</dd>'
        f'<dt>TCP / HTTP</dt><dd>{int(producer["tcp_port"])} / {int(producer["http_port"])}</dd>'
        f'<dt>Topics</dt><dd data-metric="topics">{len(topics)}</dd>'
        f'<dt>Messages</dt><dd data-metric="total_messages">{num(total_msgs)}</dd>'
        f'<dt>Clients</dt><dd data-metric="total_clients">{num(total_clients)}</dd>'
        '</dl></div>')
    trs = []
    for t in topics:
        name = t["topic_name"]
        trs.append(
            f'<tr class="topic-row" data-topic="{e(name)}"><td class="name">'
            f'<a href="{ctx.url("/topics/" + q(name))}">{e(name)}</a>{_paused(t["paused"])}</td>'
            f'{_cell("depth", t["depth"])}<td class="num">–</td><td class="num">–</td>'
            f'{_cell("message_count", t["message_count"])}<td class="num">–</td></tr>')
        for c in t["channels"]:
            cname = c["channel_name"]
            trs.append(
                f'<tr class="channel-row" data-topic="{e(name)}" data-channel="{e(cname)}">'
                f'<td class="name indent"><a href="{ctx.url(f"/topics/{q(name)}/{q(cname)}")}">'
                f'{e(cname)}</a>{_paused(c["paused"])}</td>'
                f'{_cell("depth", c["depth"])}{_cell("in_flight_count", c["in_flight_count"])}'
                f'{_cell("requeue_count", c["requeue_count"])}'
                f'{_cell("message_count", c["message_count"])}'
                f'{_cell("client_count", c["client_count"])}</tr>')
    body.append(
        '<div class="table-wrap"><table class="table" id="node-topics"><thead><tr>'
        '<th>Topic / channel</th><th class="num">Depth</th><th class="num">In-Flight</th>'
        '<th class="num">Requeued</th><th class="num">Messages</th>'
        '<th class="num">Connections</th></tr></thead><tbody>' + "".join(trs)
        + "</tbody></table></div>")
    return layout(ctx, f"Node {node}", "nodes", "".join(body), page="node")


# ------------------------------------------------------------------------- counter, lookup

def render_counter(ctx: Ctx) -> str:
    body = ('<div class="counter-page"><h2>Messages processed</h2>'
            '<div class="counter" id="counter" data-src="'
            f'{ctx.url("/api/counter")}">–</div>'
            '<p class="muted" id="counter-rate">&nbsp;</p></div>')
    return layout(ctx, "Counter", "counter", body, page="counter")


def render_lookup(ctx: Ctx, topics: dict[str, list[str]], inactive: set[str]) -> str:
    body = [f'<div class="page-head"><h2>Lookup <span class="count">{len(topics)}</span></h2>'
            '</div>']
    if not ctx.lookupd:
        body.append('<div class="alert alert-info">nsqadmin was started with '
                    '--nsqd-http-address: there is no nsqlookupd to show.</div>')
    else:
        addrs = ", ".join(e(a) for a in ctx.lookupd)
        body.append(f'<p class="muted">Topics and channels registered in nsqlookupd ({addrs}).'
                    '</p>')
        trs = []
        for t, chans in topics.items():
            clinks = " ".join(
                f'<a class="badge" href="{ctx.url(f"/topics/{q(t)}/{q(c)}")}">{e(c)}</a>'
                for c in chans)
            flag = (' <span class="badge badge-warn">no producers</span>'
                    if t in inactive else "")
            trs.append(f'<tr data-topic="{e(t)}"><td class="name">'
                       f'<a href="{ctx.url("/topics/" + q(t))}">{e(t)}</a>{flag}</td>'
                       f'<td>{clinks}</td></tr>')
        body.append('<div class="table-wrap"><table class="table" id="lookup-table"><thead>'
                    '<tr><th>Topic</th><th>Channels</th></tr></thead><tbody>' + "".join(trs)
                    + "</tbody></table></div>")
        body.append(_create_form(ctx))
    return layout(ctx, "Lookup", "lookup", "".join(body), page="lookup")


# ------------------------------------------------------------- route-managed ordered topics

def _route_history(node: str, h: dict[str, Any]) -> str:
    """A route-managed topic's versions: a picture (each version a bar of its logical
    ranges, one colour per physical partition) above a table of the same ranges, then
    the sealed partitions and each channel's barrier version, as nsqd reported them."""
    logical = max(int(h.get("logical") or 1), 1)

    def colour(p: int) -> str:
        return f"hsl({(p * 67) % 360}, 55%, 62%)"

    bars, trs = [], []
    versions = list(h.get("versions") or ())
    row_h, label_w, width = 22, 40, 1000  # SVG presentation attributes: no inline CSS (CSP)
    for i, v in enumerate(versions):
        y = i * row_h
        bars.append(f'<g class="route-row"><text x="0" y="{y + 15}" font-size="12" '
                    f'fill="#666">v{v["version"]}</text>')
        for lo, hi, p, n in v["routes"]:
            x = label_w + lo * width / logical
            w = (hi - lo) * width / logical
            bars.append(f'<rect x="{x:.2f}" y="{y + 2}" width="{w:.2f}" height="{row_h - 4}" '
                        f'fill="{colour(p)}" stroke="#fff"><title>{lo}-{hi - 1} &#8594; '
                        f'partition {p} @ {e(str(n))}</title></rect>'
                        f'<text x="{x + w / 2:.2f}" y="{y + 15}" font-size="11" '
                        f'text-anchor="middle">{p}</text>')
        bars.append("</g>")
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime((v.get("committed_ms") or 0) / 1000))
        ranges = "<br>".join(f"{lo}&#8211;{hi - 1} &#8594; {p} @ {e(str(n))}"
                             for lo, hi, p, n in v["routes"])
        trs.append(f"<tr><td>{v['version']}</td><td>{when} UTC</td><td>{ranges}</td></tr>")
    extra = []
    sealed = h.get("sealed")
    if sealed:
        extra.append("<p>Sealed partitions (offset of their command message): "
                     + ", ".join(f"{e(str(k))} @ {e(str(o))}" for k, o in sorted(sealed.items()))
                     + "</p>")
    chans = h.get("channels")
    if chans:
        extra.append("<p>Channels' route versions: " + ", ".join(
            f"{e(c)} v{e(str((st or {}).get('version')))}" for c, st in sorted(chans.items()))
            + "</p>")
    if h.get("pending"):
        extra.append('<div class="alert alert-warning">A change is pending (version '
                     f'{e(str(h["pending"].get("version")))}).</div>')
    return (f'<h3 id="routes">Routes <span class="muted">{logical} logical partitions, '
            f'{len(h.get("versions") or ())} versions — from {e(node)}</span></h3>'
            f'<svg class="route-picture" viewBox="0 0 {label_w + width} {len(versions) * row_h}" '
            f'width="100%" role="img" aria-label="logical ranges by version">'
            + "".join(bars) + "</svg>"
            '<table class="table" id="route-table"><thead><tr><th>version</th><th>committed</th>'
            "<th>logical ranges &#8594; partition @ node</th></tr></thead><tbody>"
            + "".join(trs) + "</tbody></table>" + "".join(extra))


def _route_forms(topic: str, h: dict[str, Any]) -> str:
    """Split, merge and move of the newest version's partitions (POST /api/topics/:topic,
    which calls nsqd's /topic/split|merge|move; nsqd checks the values and its refusal is
    shown as is)."""
    versions = h.get("versions") or ()
    newest = sorted(versions[-1]["routes"]) if versions else []

    def choice(name: str, label: str, pick: int = 0) -> str:
        opts = "".join(f'<option value="{p}"{" selected" if i == pick else ""}>{p} '
                       f'({lo}&#8211;{hi - 1})</option>'
                       for i, (lo, hi, p, _n) in enumerate(newest))
        return f'<select name="{name}" aria-label="{e(label)}" title="{e(label)}">{opts}</select>'

    def form(op: str, fields: str, button: str) -> str:
        return (f'<form class="form-row route-change" data-op="{op}" data-topic="{e(topic)}" '
                f'data-api="/api/topics/{e(q(topic))}">{fields}'
                f'<button type="submit" class="btn btn-warning">{button}</button></form>')

    node = e(str(newest[0][3])) if newest else ""
    parts = [form("split", choice("partition", "partition to split") +
                  '<input name="at" type="number" min="0" step="1" required '
                  'placeholder="at logical partition" aria-label="boundary (logical partition)">',
                  "Split")]
    if len(newest) > 1:
        parts.append(form("merge", choice("a", "partition") + choice("b", "adjacent partition", 1),
                          "Merge"))
    parts.append(form("move", choice("partition", "partition to move") +
                      f'<input name="node" required maxlength="256" placeholder="node, e.g. {node}" '
                      'aria-label="target node">', "Move"))
    return ('<div class="card" id="route-actions"><h4>Change routes</h4>' + "".join(parts)
            + '<p class="muted">Each change appends a command message to the partitions it '
            'retires and commits a new route version; producers use the newest version, ordered '
            'consumers follow once they reach the command message.</p></div>')


# ------------------------------------------------------------------------- cluster mode

def _shape(t: dict[str, Any]) -> str:
    n = t.get("partition_num", len(t.get("partitions") or ()))
    return (f"{n} partition{'s' if n != 1 else ''} x {t.get('replica')} replicas, "
            f"min ISR {t.get('min_isr')}{', ordered' if t.get('ordered') else ''}")


def _ids(ids: Iterable[str], cls: str = "") -> str:
    out = " ".join(f'<span class="badge{cls}">{e(i)}</span>' for i in ids)
    return out or '<span class="muted">–</span>'


_NO_LEADER = '<span class="badge badge-down">none</span>'


def _partition_table(ctx: Ctx, topic: str, t: dict[str, Any], stats: dict[str, Any]) -> str:
    """One row per partition: leader, epoch, replicas, ISR, catch-up set, and each replica's
    log end and lag behind the leader (when lookupd reported them)."""
    live = {n["id"] for n in stats.get("nodes") or ()}
    trs = []
    for p in t.get("partitions") or ():
        leader = p.get("leader")
        ends = p.get("log_end") or {}
        lags = p.get("lag") or {}
        reps = []
        for r in p.get("replicas") or ():
            end, lag = ends.get(r), lags.get(r)
            cls = "replica" + ("" if r in p.get("isr", ()) else " out-of-sync") + \
                ("" if r in live else " not-live")
            reps.append(
                f'<div class="{cls}" data-node="{e(r)}" '
                f'data-log-end="{"" if end is None else int(end)}" '
                f'data-lag="{"" if lag is None else int(lag)}">'
                f'<span class="node-id">{e(r)}</span> '
                f'<span class="num">{"?" if end is None else num(end)}</span>'
                + ("" if r == leader else
                   f' <span class="lag{" lag-behind" if lag else ""}">lag '
                   f'{"?" if lag is None else num(lag)}</span>')
                + ("" if r in live else ' <span class="badge badge-down">not live</span>')
                + "</div>")
        trs.append(
            f'<tr data-partition="{int(p["partition"])}" data-leader="{e(leader or "")}" '
            f'data-epoch="{int(p["epoch"])}" data-replicas="{e(",".join(p.get("replicas", ())))}" '
            f'data-isr="{e(",".join(p.get("isr", ())))}" '
            f'data-catchup="{e(",".join(p.get("catchup", ())))}">'
            f'<td class="num">{int(p["partition"])}</td>'
            f'<td>{e(leader) if leader else _NO_LEADER}</td>'
            f'<td class="num">{int(p["epoch"])}</td>'
            f'<td class="ids">{_ids(p.get("isr", ()), " badge-ok")}</td>'
            f'<td class="ids">{_ids(p.get("catchup", ()), " badge-warn")}</td>'
            f'<td class="replicas">{"".join(reps)}</td></tr>')
    return (f'<div class="table-wrap"><table class="table partitions" '
            f'data-topic="{e(topic)}"><thead><tr>'
            '<th class="num">Partition</th><th>Leader</th><th class="num">Epoch</th>'
            '<th>ISR</th><th>Catch-up</th>'
            '<th title="each replica: its log end as its node reports it, and how far it is '
            'behind the leader\'s log end">Replicas: log end, lag</th>'
            '</tr></thead><tbody>' + "".join(trs) + "</tbody></table></div>")


def _cluster_create_form(ctx: Ctx) -> str:
    if not ctx.is_admin:
        return ""
    return (
        '<form class="create-form card" id="cluster-create-form" '
        'data-api="/api/cluster/topics"><h4>Create a partitioned topic</h4>'
        '<div class="form-row">'
        '<input name="topic" placeholder="topic name" required '
        'pattern="[.a-zA-Z0-9_\\-]+" maxlength="64" aria-label="topic">'
        '<input name="partitions" type="number" min="1" max="1024" step="1" value="1" '
        'required aria-label="partitions" title="partitions">'
        '<input name="replicas" type="number" min="1" max="16" step="1" '
        'placeholder="replicas" aria-label="replicas" '
        'title="replicas (empty: min(3, live nodes))">'
        '<label class="check"><input name="ordered" type="checkbox"> ordered</label>'
        '<button type="submit" class="btn btn-primary">Create</button></div>'
        '<p class="muted">Created through nsqlookupd (<code>/topic/create</code>); creating '
        'it again with the same shape is harmless, another shape is refused.</p></form>')


def render_cluster(ctx: Ctx, stats: dict[str, Any] | None, failed: bool = False) -> str:
    """The cluster as lookupd's /cluster/stats shows it: coordinator, nodes (drain buttons),
    and every topic's partitions. ``stats`` None: no cluster mode (or no answer)."""
    body = ['<div class="page-head"><h2>Cluster</h2></div>']
    if stats is None:
        if failed:
            body.append('<div class="alert alert-danger" id="cluster-failed">nsqlookupd did '
                        'not answer <code>/cluster/stats</code>; see the warning above.</div>')
        elif not ctx.lookupd:
            body.append('<div class="alert alert-info" id="cluster-off">Cluster mode is off: '
                        'nsqadmin was started with --nsqd-http-address (no nsqlookupd).</div>')
        else:
            body.append('<div class="alert alert-info" id="cluster-off">Cluster mode is off: '
                        f'nsqlookupd ({e(", ".join(ctx.lookupd))}) runs standalone (no '
                        '<code>--cluster-leadership-addresses</code>).</div>')
        return layout(ctx, "Cluster", "cluster", "".join(body), page="cluster")
    draining = set(stats.get("draining") or ())
    nodes = stats.get("nodes") or []
    body.append(
        '<div class="summary card"><dl>'
        f'<dt>Cluster id</dt><dd id="cluster-id">{e(stats.get("cluster_id", ""))}</dd>'
        f'<dt>Coordinator</dt><dd id="coordinator">'
        f'{e(stats.get("coordinator") or "none elected")}</dd>'
        f'<dt>Nodes</dt><dd>{len(nodes)} live'
        f'{f", {len(draining)} draining" if draining else ""}</dd>'
        f'<dt>Topics</dt><dd>{len(stats.get("topics") or {})}</dd></dl></div>')
    # replicas held per node (a drained node ends with none)
    held: dict[str, int] = {}
    led: dict[str, int] = {}
    for t in (stats.get("topics") or {}).values():
        for p in t.get("partitions") or ():
            for r in p.get("replicas") or ():
                held[r] = held.get(r, 0) + 1
            if p.get("leader"):
                led[p["leader"]] = led.get(p["leader"], 0) + 1
    rows = []
    ids = [n["id"] for n in nodes] + sorted(draining - {n["id"] for n in nodes})
    by_id = {n["id"]: n for n in nodes}
    for nid in ids:
        n = by_id.get(nid)
        state = ('<span class="badge badge-ok">live</span>' if n else
                 '<span class="badge badge-down">not live</span>')
        if nid in draining:
            state += ' <span class="badge badge-warn">draining</span>'
        action = ""
        if ctx.is_admin:
            api = f"/api/cluster/nodes/{q(nid)}"
            if nid in draining:
                action = _btn("Stop draining", "btn-xs btn-success",
                              {"action": "undrain", "api": api,
                               "confirm": f"Stop draining node {nid}? Replicas already moved "
                                          "stay where they are."})
            elif n:
                action = _btn("Drain", "btn-xs btn-warning",
                              {"action": "drain", "api": api,
                               "confirm": f"Drain node {nid}? Its replicas move to other "
                                          "nodes, then it leads and holds nothing."})
        st = "draining" if nid in draining else ("live" if n else "gone")
        rows.append(
            f'<tr data-node="{e(nid)}" data-state="{st}">'
            f'<td class="name">{e(nid)}</td>'
            f'<td>{e(n["tcp_address"]) if n else "–"}</td>'
            f'<td>{e(n["http_address"]) if n else "–"}</td>'
            f'<td>{e(n.get("version", "")) if n else ""}</td><td>{state}</td>'
            f'<td class="num" data-metric="replicas">{held.get(nid, 0)}</td>'
            f'<td class="num" data-metric="leaders">{led.get(nid, 0)}</td>'
            f'<td>{action}</td></tr>')
    body.append(
        f'<h3>Nodes <span class="count">{len(ids)}</span></h3>'
        '<div class="table-wrap"><table class="table" id="cluster-nodes"><thead><tr>'
        '<th>Node id</th><th>TCP</th><th>HTTP</th><th>Version</th><th>State</th>'
        '<th class="num">Replicas</th><th class="num">Leads</th><th></th></tr></thead><tbody>'
        + "".join(rows) + "</tbody></table></div>")
    topics = stats.get("topics") or {}
    body.append(f'<h3>Topics <span class="count">{len(topics)}</span></h3>')
    if not topics:
        body.append('<div class="alert alert-info">No topic has been created in the cluster '
                    'yet.</div>')
    for name, t in sorted(topics.items()):
        body.append(
            f'<section class="cluster-topic" data-topic="{e(name)}"><h4>'
            f'<a href="{ctx.url("/topics/" + q(name))}">{e(name)}</a> '
            f'<span class="muted">{e(_shape(t))}</span></h4>'
            + _partition_table(ctx, name, t, stats) + "</section>")
    body.append(_cluster_create_form(ctx))
    return layout(ctx, "Cluster", "cluster", "".join(body), page="cluster")


def render_error(ctx: Ctx, status: int, message: str) -> str:
    body = (f'<div class="alert alert-danger"><h4>Error {status}</h4><p>{e(message)}</p></div>')
    return layout(ctx, f"Error {status}", "", body, page="error")
