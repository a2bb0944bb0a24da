"""`host_port`: the one reading of a "HOST:PORT" address (a log server, the rendezvous store).

Owns the rule every such address follows: the text after the last colon is a port in 1..65535,
the text before it a host with no blank in it (an IPv6 host keeps its own colons); surrounding
blanks are dropped. Callers turn None into their own one-line error.
"""

from __future__ import annotations


def host_port(text: str) -> tuple[str, int] | None:
    """(host, port) of `text`, or None when it is not HOST:PORT."""
    host, sep, port = text.strip().rpartition(":")
    if not sep or not host or any(c.isspace() for c in host) or not port.isdigit() or not 0 < int(port) < 65536:
        return None
    return host, int(port)
