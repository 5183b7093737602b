"""The network story: "network or MySQL?", the four-point method's first question, answered per client host and
connection. network_s (A4 − A1 − (D4 − D1)) is independent of the clocks' offset, so summing it by client host
tells where the wire, not the server, took the clients' time (through a proxy: its two hops, not its own time). Retransmissions come from the TCP layer (bytes
reassembly dropped as duplicates, per connection); an exchange whose network time is at least Linux's smallest
retransmission timeout (RTO_MIN_S) on a connection that retransmitted is a likely RTO stall (likely: the capture
shows the duplicate bytes, not which exchange they belonged to)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..core.exact import masked_sums
from ..core.formats import plural, seconds_rounded, share
from ..core.groups import aggregated, codes
from ..core.tables import text_dtype
from .waitprofile import host_codes
from .wording import connection, quoted

NETWORK_LEADS = 0.5  # network's share of the clients' time from which it leads the verdict
ONE_HOST = 0.9  # one host's share of the network time from which it is named as where it was
RTO_MIN_S = 0.2  # Linux's TCP_RTO_MIN
LISTED = 10  # hosts, connections and likely RTO stalls listed in summary.json
SQL_CHARS = 200  # a listed exchange's statement, cut


def tell(x: pd.DataFrame, conns: pd.DataFrame | None) -> dict | None:
    """summary.json → network (None without exchanges seen at both an app and a DB point)."""
    if "network_s" not in x.columns or not len(x):
        return None
    net, total, both = row_times(x)
    if not both.any():
        return None
    host, hosts = host_codes(x["client"])
    # the arrays as they are (copy=False: no consolidated copy of them); the host and the capture as categoricals
    # (a small code a row, grouped as their texts are, in lexical order), conn_id in its own dtype (not an object
    # per row)
    frame = pd.DataFrame({"host": pd.Categorical.from_codes(host[both], dtype=text_dtype(tuple(hosts))),
                          "capture": x["capture"].array[both],
                          "conn_index": x["conn_index"].to_numpy()[both], "conn_id": x["conn_id"].array[both],
                          "network_s": np.maximum(net[both], 0.0), "total_s": total[both]}, copy=False)
    del host
    sums = masked_sums(terms(x))
    net_sum, total_sum = sums["network_s"][1], sums["clients_s"][1]
    by_host = aggregated(frame.groupby("host", dropna=False), exchanges=("network_s", "size"),
                         network_s=("network_s", "sum"), total_s=("total_s", "sum"))
    by_conn = aggregated(frame.groupby(["capture", "conn_index"]), host=("host", "first"),
                         conn_id=("conn_id", "first"), exchanges=("network_s", "size"),
                         network_s=("network_s", "sum"), total_s=("total_s", "sum"))
    if conns is None or not len(conns) or "retransmitted_bytes" not in conns.columns:
        retrans = told_retransmissions(None, 0, pd.DataFrame())
    else:
        keys = retransmitting(conns, set(codes(x["capture"])[1].tolist()))
        stalls = rto_rows(x, keys[1], both, net)
        named = np.flatnonzero(stalls)
        named = named[np.argsort(-net[named], kind="stable")][:LISTED]
        retrans = told_retransmissions(keys[0], int(stalls.sum()), x.iloc[named].assign(_net=net[named]))
    return told(net_sum, total_sum, by_host, by_conn, retrans)


def row_times(x: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per row of `x` (the table or a chunk): its network time (through a proxy its two hops, not its own time),
    its clients' time, and whether both are known."""
    net = x["network_s"].to_numpy(dtype="float64", na_value=np.nan)
    if "proxy_s" in x.columns and x["proxy_s"].notna().any():
        # through a proxy, total − server holds the proxy's own time too: the network is its two hops
        hops = [x[c].to_numpy(dtype="float64", na_value=np.nan) for c in ("net_app_proxy_s", "net_proxy_db_s")
                if c in x.columns]
        net = hops[0] + hops[1] if len(hops) == 2 else np.full(len(x), np.nan)
    total = x["total_s"].to_numpy(dtype="float64", na_value=np.nan)
    return net, total, ~np.isnan(net) & ~np.isnan(total)


def terms(x: pd.DataFrame):
    """The story's sums as (name, rows, values) terms (core.exact.masked_sums: in row order): the network time
    (negative ones as 0) and the clients' time of the rows where both are known."""
    net, total, both = row_times(x)
    yield "network_s", both, np.maximum(net, 0.0)
    yield "clients_s", both, total


def told(net_sum: float, total_sum: float, by_host: pd.DataFrame, by_conn: pd.DataFrame, retrans: dict) -> dict:
    """summary.json → network from the sums and the per-host and per-connection aggregates (in the groupby's
    order: hosts in lexical order, the unknown last; connections by capture and conn_index)."""
    by_host = by_host.sort_values("network_s", ascending=False)
    by_conn = by_conn.sort_values("network_s", ascending=False)
    return {
        "network_s": net_sum, "clients_s": total_sum, "share": net_sum / total_sum if total_sum > 0 else None,
        "hosts": [{"host": h, "exchanges": int(r.exchanges), "network_s": float(r.network_s),
                   "share_of_network": float(r.network_s) / net_sum if net_sum > 0 else None,
                   "network_share_of_its_time": float(r.network_s) / float(r.total_s) if r.total_s > 0 else None}
                  for h, r in by_host.head(LISTED).iterrows()],
        "hosts_total": int(len(by_host)),
        "connections": [{"capture": k[0], "conn_index": int(k[1]), "conn_id": None if pd.isna(r.conn_id) else int(r.conn_id),
                         "host": r.host, "exchanges": int(r.exchanges), "network_s": float(r.network_s)}
                        for k, r in by_conn.head(LISTED).iterrows()],
        **retrans,
    }


def retransmitting(conns: pd.DataFrame, captures: set) -> tuple[np.ndarray, set]:
    """(the retransmitted bytes of each connection of `captures`, the connections that retransmitted)."""
    c = conns[conns["capture"].astype(object).isin(captures)]
    rb = c["retransmitted_bytes"].to_numpy(dtype="float64", na_value=0.0)
    return rb, set(zip(c["capture"].astype(object)[rb > 0], c["conn_index"].astype("int64")[rb > 0]))


def rto_rows(x: pd.DataFrame, keys: set, both: np.ndarray, net: np.ndarray) -> np.ndarray:
    """The rows of `x` (the table or a chunk) that are likely RTO stalls: on a connection that retransmitted
    (`keys`), both times known, RTO_MIN_S or more on the network."""
    on = np.zeros(len(x), dtype=bool)
    if keys:  # the rows of those connections, by the capture's code and conn_index (not a tuple per row)
        code, names = codes(x["capture"])
        index = x["conn_index"].to_numpy(dtype=np.int64)
        for k, name in enumerate(names):
            wanted = [i for cap, i in keys if cap == name]
            if wanted:
                on |= (code == k) & np.isin(index, wanted)
    return on & both & (np.nan_to_num(net) >= RTO_MIN_S)


def told_retransmissions(rb: np.ndarray | None, stalls: int, named: pd.DataFrame) -> dict:
    """summary.json → network's retransmissions: `rb` the connections' retransmitted bytes (None: no connections
    table says), `stalls` the likely RTO stalls, `named` the listed ones' rows in order, their network time in
    `_net`."""
    if rb is None:
        return {"retransmitted_bytes": None, "retransmitting_connections": None, "rto_stalls_likely": None,
                "rto_stalls": []}
    sent = named["app_req_ts"] if "app_req_ts" in named.columns else named["req_first_ts"]
    return {"retransmitted_bytes": int(rb.sum()), "retransmitting_connections": int((rb > 0).sum()),
            "rto_stalls_likely": stalls,
            "rto_stalls": [{"capture": named["capture"].iloc[i], "conn_index": int(named["conn_index"].iloc[i]),
                            "conn_id": None if pd.isna(named["conn_id"].iloc[i]) else int(named["conn_id"].iloc[i]),
                            "client": None if pd.isna(named["client"].iloc[i]) else str(named["client"].iloc[i]),
                            "sent": None if pd.isna(sent.iloc[i]) else pd.Timestamp(sent.iloc[i]).isoformat(),
                            "sql": None if pd.isna(named["sql"].iloc[i]) else str(named["sql"].iloc[i])[:SQL_CHARS],
                            "command": str(named["command"].iloc[i]), "network_s": float(named["_net"].iloc[i])}
                           for i in range(len(named))]}


def bullets(story: dict | None) -> tuple[str | None, list[dict], list[str]]:
    """(a lead sentence when network took NETWORK_LEADS of the clients' time or more, else None; the verdict's
    network bullets; findings)."""
    if not story or not story.get("network_s"):
        return None, [], []
    hosts = story["hosts"]
    top = hosts[0] if hosts else None
    where = ""
    if top is not None and top.get("share_of_network") is not None:
        if top["share_of_network"] >= ONE_HOST:
            where = (f", {'all' if top['share_of_network'] > 0.995 else share(top['share_of_network'])} of it on "
                     f"{top['host']}")
        elif len(hosts) > 1:
            where = f", the most on {top['host']} ({share(top['share_of_network'])} of it)"
    out = []
    lead = None
    findings = []
    if story.get("share") is not None and story["share"] >= NETWORK_LEADS:
        lead = (f"{share(story['share'])} of the clients' time was network "
                f"({seconds_rounded(story['network_s'])} of {seconds_rounded(story['clients_s'])}){where}: the wire "
                "between the app and the DB host, not MySQL.")
        findings.append("network")
    if lead or (len(hosts) > 1 and (story.get("share") or 0) >= 0.1):
        parts = [f"{h['host']} {seconds_rounded(h['network_s'])}"
                 + (f" ({share(h['network_share_of_its_time'])} of its time)" if h.get("network_share_of_its_time")
                    is not None else "") for h in hosts[:3]]
        out.append({"topic": "network", "text": "Network time by client host: " + ", ".join(parts)
                    + (f", {story['hosts_total'] - 3} more" if story["hosts_total"] > 3 else "") + "."})
    if story.get("retransmitted_bytes"):
        stalls = story.get("rto_stalls_likely") or 0
        out.append({"topic": "network", "text": (
            f"TCP retransmitted {story['retransmitted_bytes']:,} bytes on {story['retransmitting_connections']} "
            f"{plural(story['retransmitting_connections'], 'connection', 'connections')}"
            + (f"; {stalls} {plural(stalls, 'exchange', 'exchanges')} there spent {seconds_rounded(RTO_MIN_S)} or more "
               "on the network (likely retransmission timeouts, not MySQL)" + _named(story.get("rto_stalls") or [])
               if stalls else "") + ".")})
        if stalls:
            findings.append("retransmissions")
    return lead, out, findings


def _named(stalls: list[dict]) -> str:
    """The likely RTO stalls by connection and statement, the longest first (three at most)."""
    if not stalls:
        return ""
    parts = []
    for r in stalls[:3]:
        what = quoted(r["sql"] if r.get("sql") else r.get("command"), 60)
        when = pd.Timestamp(r["sent"]).strftime("%H:%M:%S.%f")[:-3] if r.get("sent") else "?"
        conn = connection(r["conn_id"]) if r.get("conn_id") is not None else f"client {r.get('client')}"
        parts.append(f"{conn} {what} sent {when}, {seconds_rounded(r['network_s'])} on the network")
    return ": " + "; ".join(parts)
