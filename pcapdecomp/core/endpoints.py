"""Endpoints as text: an (ip, port) as the tables write it ("10.0.0.1:3306", "[::1]:3306") and back."""

from __future__ import annotations

Endpoint = tuple[str, int]  # (ip as text, port)


def split_endpoint(text: str) -> Endpoint:
    """ "10.0.0.1:3306" or "[::1]:3306" -> (ip, port): endpoint_text's inverse."""
    host, _, port = text.rpartition(":")
    return host.strip("[]"), int(port)


def endpoint_text(ep: Endpoint) -> str:
    """(ip, port) as the tables write it: "10.0.0.1:3306", "[::1]:3306" for IPv6."""
    ip, port = ep
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def address_of(endpoint) -> str | None:
    """The address of an "ip:port" endpoint ("[v6]:port" too), leniently: None when unknown, the text itself when it
    has no port."""
    if not isinstance(endpoint, str) or not endpoint:
        return None
    if endpoint.startswith("["):
        return endpoint[1:endpoint.find("]")] if "]" in endpoint else endpoint
    return endpoint.rpartition(":")[0] or endpoint
