"""Node identities: Ed25519 key pairs on disk, and signing and verifying with them.

Owns the files `seedflood keys` writes — `node-<i>.key` (node i's private key: PKCS#8 PEM, the
format OpenSSL and ssh tooling read, unencrypted because a launched process has nobody to type a
passphrase, so mode 0600 is its guard) and `roster.json` (every node's public key, the one file
every participant needs) — and `Identity` (one node's `sign`) and `PublicRoster` (the run's
`verify`), which flood/signing.py's `Signing` takes as plain functions.

Uses the `cryptography` package (OpenSSL's Ed25519, well kept and audited) rather than code of
our own: signatures are 64 bytes, keys 32; a signature costs 40-50 µs of CPU to make and
120-180 µs to check on a 2-core VM (docs/trust.md).

Assumes: node i's key file is on node i only; a key readable by group or others is refused, as
ssh refuses one.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

ROSTER = "roster.json"
SCHEME = "ed25519"


class IdentityError(ValueError):
    """A key or roster file is missing, unreadable, or not what the run needs (one line)."""


def key_file(keys: Path, node: int) -> Path:
    return keys / f"node-{node}.key"


@dataclass(frozen=True)
class PublicRoster:
    """Every node's public key (32 raw bytes), indexed by node id."""

    keys: tuple[bytes, ...]
    _loaded: dict[int, Ed25519PublicKey] = field(default_factory=dict, compare=False, repr=False)
    """The parsed public keys, filled on first use: `verify` does not re-parse per call."""

    def __post_init__(self) -> None:
        if any(len(k) != 32 for k in self.keys):
            raise IdentityError("roster: every public key is 32 bytes (64 hex digits)")

    @classmethod
    def from_hex(cls, keys: Sequence[str]) -> PublicRoster:
        try:
            raw = tuple(bytes.fromhex(k) for k in keys)
        except ValueError as e:
            raise IdentityError(f"roster: a public key is not hex ({e})") from None
        return cls(raw)

    def __len__(self) -> int:
        return len(self.keys)

    def hex(self) -> list[str]:
        return [k.hex() for k in self.keys]

    def digest(self) -> str:
        """sha256 over the raw keys in node order."""
        return hashlib.sha256(b"".join(self.keys)).hexdigest()

    def verify(self, node: int, payload: bytes, sig: bytes) -> bool:
        """Whether `sig` is node `node`'s signature of `payload`; False (never raises) for a node
        out of range or a signature of the wrong length."""
        if not 0 <= node < len(self.keys) or len(sig) != 64:
            return False
        key = self._loaded.get(node)
        if key is None:
            key = self._loaded[node] = Ed25519PublicKey.from_public_bytes(self.keys[node])
        try:
            key.verify(sig, payload)
        except InvalidSignature:
            return False
        return True


class Identity:
    """Node `node`'s private key."""

    def __init__(self, node: int, key: Ed25519PrivateKey) -> None:
        self.node = node
        self._key = key
        self.public = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)

    def sign(self, payload: bytes) -> bytes:
        """A 64-byte Ed25519 signature (deterministic: the same payload, the same bytes)."""
        return self._key.sign(payload)


def _write_private(path: Path, data: bytes) -> None:
    """Write `data` to `path` readable by its owner only, atomically: a fresh temp file in the same
    directory (mkstemp: created exclusively, mode 0600, so a stale temp file of another mode is
    never reused), then a rename over `path`."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_keys(out: Path, nodes: int, force: bool = False) -> Path:
    """A fresh key pair per node 0..nodes-1 under `out`, and roster.json; returns its path. With
    `force`, keys already there are replaced, and a node-<i>.key with i >= nodes is removed (it
    would be no node's key in the new roster)."""
    if not 1 <= nodes <= 100_000:
        raise IdentityError(f"--nodes: must be in 1..100000, got {nodes}")
    roster = out / ROSTER
    if not force and (roster.exists() or any(out.glob("node-*.key"))):
        raise IdentityError(
            f"{out} already holds keys: pass --force to replace them (every node then needs its new key)"
        )
    try:
        out.mkdir(parents=True, exist_ok=True)
        public = []
        for i in range(nodes):
            key = Ed25519PrivateKey.generate()
            pem = key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
            _write_private(key_file(out, i), pem)
            public.append(Identity(i, key).public.hex())
        for stale in out.glob("node-*.key"):
            number = stale.name[len("node-") : -len(".key")]
            if number.isdigit() and int(number) >= nodes:
                stale.unlink()
        text = json.dumps({"scheme": SCHEME, "nodes": nodes, "public_keys": public}, indent=1) + "\n"
        tmp = roster.with_name(f".{ROSTER}.tmp")
        tmp.write_text(text)
        os.replace(tmp, roster)
    except OSError as e:
        raise IdentityError(f"cannot write keys to {out}: {e.strerror or e}") from None
    return roster


def load_roster(keys: Path) -> PublicRoster:
    """The public keys of `keys` (the directory `write_keys` filled, or its roster.json)."""
    path = keys if keys.suffix == ".json" else keys / ROSTER
    try:
        d = json.loads(path.read_text())
    except OSError as e:
        raise IdentityError(
            f"cannot read the roster {path}: {e.strerror or e} (write one with `seedflood keys`)"
        ) from None
    except ValueError as e:
        raise IdentityError(f"{path} is not JSON: {e}") from None
    if not isinstance(d, dict) or d.get("scheme") != SCHEME or not isinstance(d.get("public_keys"), list):
        raise IdentityError(f"{path} is not a roster `seedflood keys` wrote (scheme {SCHEME}, public_keys)")
    if d.get("nodes") != len(d["public_keys"]):
        raise IdentityError(f"{path} says {d.get('nodes')} nodes but holds {len(d['public_keys'])} public keys")
    if not all(isinstance(k, str) for k in d["public_keys"]):
        raise IdentityError(f"{path}: every public key is a hex string")
    return PublicRoster.from_hex(d["public_keys"])


def load_identity(keys: Path, node: int, roster: PublicRoster) -> Identity:
    """Node `node`'s private key from `keys`, checked against the roster: a process without it
    (or with another node's) cannot act as that node."""
    keys = keys.parent if keys.suffix == ".json" else keys
    path = key_file(keys, node)
    if not 0 <= node < len(roster):
        raise IdentityError(f"node {node} has no public key in the roster ({len(roster)} keys)")
    try:
        mode = path.stat().st_mode
        data = path.read_bytes()
    except OSError as e:
        raise IdentityError(f"node {node} cannot read its key {path}: {e.strerror or e}") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise IdentityError(f"{path} is readable by others (mode {stat.S_IMODE(mode):o}): chmod 600 it")
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as e:
        raise IdentityError(f"{path} is not a PEM private key: {e}") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise IdentityError(f"{path} is not an Ed25519 key")
    me = Identity(node, key)
    if me.public != roster.keys[node]:
        whose = f" (it is node {roster.keys.index(me.public)}'s)" if me.public in roster.keys else ""
        raise IdentityError(f"{path.name} is not the key of node {node} in {ROSTER}{whose}")
    return me
