"""Listening on a TCP port this process was told to use, and the one line when it cannot.

Owns `ListenError` (the CLI answers it in one line, exit status 2: the port is another process's,
or the address is not this machine's) and `listen_error`, which builds it from the OS's error or
torch's TCPStore error naming the port and what to change.

May import: nothing of seedflood.

Assumes nothing: pure Python.
"""

from __future__ import annotations

import errno
import re

_TCPSTORE_MESSAGE = re.compile(r"\bmessage: ([^\n]+)")  # c10d's "... name: EADDRINUSE, message: address already in use"


class ListenError(OSError):
    """This process cannot listen where it was told to (one line naming the port)."""


def listen_error(what: str, host: str, port: int, error: BaseException, change: str) -> ListenError:
    """`what` cannot listen on host:port (on `port` of every address when `host` is ""), in one line: why (the OS's words), and, when the port
    is taken, that another process holds it and to pick another `change` (an option or variable)."""
    if isinstance(error, OSError) and error.strerror:
        why = error.strerror[:1].lower() + error.strerror[1:]
    elif found := _TCPSTORE_MESSAGE.search(str(error)):
        why = found.group(1).strip()
    else:
        why = str(error).splitlines()[0] if str(error) else type(error).__name__
    taken = getattr(error, "errno", None) == errno.EADDRINUSE or "EADDRINUSE" in str(error) or "in use" in why
    hint = f": another process holds port {port}; pick another {change}" if taken else f" (check {change})"
    at = f"{host}:{port}" if host else f"port {port}"
    return ListenError(f"{what} cannot listen on {at}: {why}{hint}")
