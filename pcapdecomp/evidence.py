"""Ticket evidence: the packets of chosen exchanges, per capture point, with a note of what they show."""

from __future__ import annotations

from .match import split_endpoint


def display_filter(client: str, server: str, first_frame: int, last_frame: int) -> str:
    """A Wireshark/tshark display filter selecting one exchange's frames (both directions) in one capture.

    client and server are "ip:port" / "[ip6]:port" as in the exchanges table; the frame range is the exchange's
    request-first … response-last frame numbers in that capture (1-based, as Wireshark numbers them)."""
    ci, cp = split_endpoint(client)
    si, sp = split_endpoint(server)
    kind = "ipv6" if ":" in ci else "ip"
    return (f"{kind}.addr=={ci} && {kind}.addr=={si} && tcp.port=={cp} && tcp.port=={sp}"
            f" && frame.number>={int(first_frame)} && frame.number<={int(last_frame)}")
