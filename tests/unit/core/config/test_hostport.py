"""host_port: the one reading of HOST:PORT that churn.log_server, serve-log's fetch,
SEEDFLOOD_STORE and `status --store` share."""

from __future__ import annotations

import pytest

from seedflood.core.config.hostport import host_port


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("127.0.0.1:29500", ("127.0.0.1", 29500)),
        (" node-3.cluster:1 ", ("node-3.cluster", 1)),
        ("::1:8080", ("::1", 8080)),  # the last colon splits: an IPv6 host keeps its own
        ("host:65535", ("host", 65535)),
    ],
)
def test_an_address_reads_as_host_and_port(text, want):
    assert host_port(text) == want


@pytest.mark.parametrize(
    "text", ["", "localhost", ":29500", "host:", "host:0", "host:65536", "host:-1", "host:8e3", "my host:80", "h:1 2"]
)
def test_anything_else_is_none(text):
    assert host_port(text) is None
