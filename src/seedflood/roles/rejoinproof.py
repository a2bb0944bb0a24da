"""The rejoin handshake's proof of identity in a signed run (docs/trust.md, Identities).

Owns both halves of it. `challenge` is the sponsor's: after it has claimed a restarted neighbour
and connected the edge, and before it floods a JOIN for it or hands it anything, it sends
NONCE_SIZE fresh random bytes and takes the newcomer's answer — node p's signature (with p's key,
in this run) over p, the incarnation the sponsor claimed, the sponsor and the nonce
(`signing.rejoin_payload`); an answer that does not verify, or none within the hop timeout, and
the sponsor refuses the rejoin: it says so to the newcomer (a `REFUSED` blob), closes the edge and
floods no JOIN, so a process without node p's key is never admitted as p. `answer` is the
newcomer's half, and `refused` reads a refusal where the catch-up would come. Unsigned runs skip
the handshake (both ends run with the same `trust.sign`).

May import: seedflood.core.

Assumes: the edge to the peer is connected (blobs travel on it, apart from the hops, in order);
the nonce is fresh per handshake, so an answer recorded from one handshake is worthless in another.
"""

from __future__ import annotations

import os

from seedflood.core.flood.signing import NONCE_SIZE, Signing
from seedflood.core.flood.transport import ChurnTransport, TransportError

REFUSED = b"SFREFUSE"
"""A sponsor's refusal: these bytes, then why in UTF-8 (a catch-up starts with its own magic)."""
WAIT_S = 60.0
"""The sponsor's wait for the answer where its host has no hop bound (a churn client has one)."""


def challenge(
    transport: ChurnTransport, signing: Signing | None, peer: int, incarnation: int, timeout_s: float | None
) -> str:
    """The sponsor's half: '' when `peer` (its `incarnation`) proved it holds its node's key, or
    the run is unsigned; otherwise why not, in one line (the refusal has been sent)."""
    if signing is None:
        return ""
    nonce = os.urandom(NONCE_SIZE)
    try:
        transport.send_blob(peer, nonce)
        proof = transport.recv_blob(peer, WAIT_S if timeout_s is None else timeout_s)
    except TransportError as e:
        return f"no answer to the rejoin challenge: {e}"
    if signing.proves_rejoin(peer, incarnation, nonce, proof):
        return ""
    why = f"its answer to the rejoin challenge is not signed with node {peer}'s key"
    try:
        transport.send_blob(peer, REFUSED + why.encode())
    except TransportError:
        pass  # the edge is closed next anyway: the newcomer's wait for the catch-up fails
    return why


def answer(transport: ChurnTransport, signing: Signing | None, sponsor: int, timeout_s: float) -> None:
    """The newcomer's half: sign the sponsor's challenge with this node's key (nothing unsigned)."""
    if signing is None:
        return
    nonce = transport.recv_blob(sponsor, timeout_s)
    transport.send_blob(sponsor, signing.prove_rejoin(transport.incarnation, sponsor, nonce))


def refused(blob: bytes, sponsor: int) -> None:
    """TransportError (one line) when `blob`, where the catch-up comes, is the sponsor's refusal."""
    if blob.startswith(REFUSED):
        why = blob[len(REFUSED) :].decode(errors="replace")
        raise TransportError(f"node {sponsor} refused the rejoin: {why}")
