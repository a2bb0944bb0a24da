"""A process's signatures in a signed run (`trust.sign`): its key, the roster's, and the run's tag.

Owns `check_own_key` and `check_keys_here`: a process's key, and every key file the preflight's
machine holds, checked against the roster before anything loads a model; `signing_of`: the
`flood.signing.Signing` a client floods with — its node's private key and
the roster's public keys (comm/identity.py, from `trust.keys`), and the run tag that every
signature covers (`run_tag`: a digest of the run's trajectory and the roster's public keys, so
a signature is worth nothing in a run with other settings, another roster, or another base);
`roster_record`, the roster's public keys as the run's log header records them; and
`verifier_of`, the check of a signed run's steps against the roster its log header records
(what the evaluator, `seedflood replay` and `seedflood check` verify: certificate.StepVerifier);
`roster_differs`, that header's roster against one given from outside (`check --roster`).

May import: seedflood.core, comm.identity.

Assumes: the launcher's preflight checked the roster's size; a process holds only its own node's
private key (load_identity refuses another node's).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from seedflood.core.churn.certificate import StepVerifier
from seedflood.core.config.runconfig import Config
from seedflood.core.flood.protocol import Protocol
from seedflood.core.flood.signing import Signing

if TYPE_CHECKING:
    from seedflood.comm.identity import PublicRoster

TAG_BYTES = 16


def run_tag(trajectory: Mapping[str, Any], public_keys: list[str]) -> bytes:
    """16 bytes naming the run a signature belongs to: sha256 over its trajectory (every
    setting that changes its bits, the train split's digest included) and the roster's keys."""
    blob = json.dumps({"trajectory": dict(trajectory), "public_keys": public_keys}, sort_keys=True)
    return hashlib.sha256(blob.encode()).digest()[:TAG_BYTES]


def check_own_key(cfg: Config, node: int) -> None:
    """A signed run's client process, before its model loads: IdentityError (one line) when its
    node's key is missing, unreadable, readable by others or not the roster's entry for `node`
    (another node's key, or one of another roster). Nothing when `trust.sign` is off."""
    if cfg.trust.sign:
        from seedflood.comm import identity

        keys = Path(cfg.trust.keys)
        identity.load_identity(keys, node, identity.load_roster(keys))


def check_keys_here(keys: Path, roster: PublicRoster) -> int:
    """The preflight's check of the private keys its machine holds under `keys` (trust.keys):
    each node-<i>.key there must be node i's in `roster` (comm.identity.load_identity: readable
    by its owner only, Ed25519, the roster's key for i); a key absent here is not looked for (it
    lives on its node's machine). IdentityError (one line) for the first that is not; returns
    how many were checked."""
    from seedflood.comm import identity

    keys = keys.parent if keys.suffix == ".json" else keys
    numbers = (f.name[len("node-") : -len(".key")] for f in keys.glob("node-*.key"))  # not one stat per roster key
    present = sorted(int(n) for n in numbers if n.isdigit() and int(n) < len(roster))
    for i in present:
        identity.load_identity(keys, i, roster)
    return len(present)


def signing_of(cfg: Config, trajectory: Mapping[str, Any], node: int) -> Signing | None:
    """Node `node`'s signing in this run; None when `trust.sign` is off. IdentityError (one line)
    when its key is missing or is not the roster's entry for `node`."""
    if not cfg.trust.sign:
        return None
    from seedflood.comm import identity  # loads `cryptography`: only a signed run needs it

    keys = Path(cfg.trust.keys)
    roster = identity.load_roster(keys)
    me = identity.load_identity(keys, node, roster)
    return Signing(node, run_tag(trajectory, roster.hex()), me.sign, roster.verify)


def roster_record(cfg: Config) -> dict[str, Any] | None:
    """{"scheme", "public_keys", "digest"} of a signed run's roster, for its log header (who could
    sign what this log holds); None when `trust.sign` is off."""
    if not cfg.trust.sign:
        return None
    from seedflood.comm import identity

    roster = identity.load_roster(Path(cfg.trust.keys))
    return {"scheme": identity.SCHEME, "public_keys": roster.hex(), "digest": roster.digest()}


def roster_differs(header: Mapping[str, Any], roster: PublicRoster, name: str = "the roster given") -> str | None:
    """How the roster a log's `header` records differs from `roster`, one given from outside
    the log (`seedflood check --roster`; `name`: where it came from), in words; None when they hold the same public keys in
    the same node order. A log whose header was rewritten and re-signed with other keys proves
    its steps against its own roster, so only this comparison tells it apart."""
    trust = header.get("trust")
    if not trust:
        return "the log is unsigned (its header records no roster)"
    keys = trust.get("public_keys") if isinstance(trust, Mapping) else None
    if not isinstance(keys, list):
        return "the log header's roster is unreadable (no public_keys)"
    if len(keys) != len(roster):
        return f"the log header's roster holds {len(keys)} public keys, {name} {len(roster)}"

    def same(text: object, key: bytes) -> bool:
        try:
            return isinstance(text, str) and bytes.fromhex(text) == key
        except ValueError:
            return False

    differ = [i for i, (k, key) in enumerate(zip(keys, roster.keys)) if not same(k, key)]
    if not differ:
        return None
    shown = ", ".join(map(str, differ[:4])) + (f" and {len(differ) - 4} more" if len(differ) > 4 else "")
    which = f"node {shown}'s public key differs" if len(differ) == 1 else f"the public keys of nodes {shown} differ"
    return f"the log header's roster is not {name}: {which} (its steps were signed with other keys)"


class UnsignedLogError(ValueError):
    """A log header's roster cannot be read (one line)."""


def verifier_of(header: Mapping[str, Any], protocol: Protocol, certified: bool) -> StepVerifier | None:
    """The check of every step of the run `header` heads (a log's header: its trajectory, and
    the roster it records under "trust") before it is taken from anyone: None for an unsigned
    run. `certified`: its steps are committed by votes (churn), so each needs a certificate. It signs nothing (it holds no private key); its tag is the one every client signs with
    (`run_tag` of the same trajectory and keys). UnsignedLogError when the roster is not one."""
    trust = header.get("trust")
    if not trust:
        return None
    from seedflood.comm import identity

    try:
        roster = identity.PublicRoster.from_hex(trust["public_keys"])
    except (identity.IdentityError, KeyError, TypeError) as e:
        raise UnsignedLogError(f"the log header's roster is unreadable: {e}") from None
    if trust.get("digest") != roster.digest():
        raise UnsignedLogError("the log header's roster does not match its digest")
    signing = Signing(-1, run_tag(header["trajectory"], roster.hex()), _signs_nothing, roster.verify)
    return StepVerifier(signing, certified, protocol.ids)


def _signs_nothing(payload: bytes) -> bytes:
    raise ValueError("a verifier holds no private key")
