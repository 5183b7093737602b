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
