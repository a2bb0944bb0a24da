"""comm/identity.py: key files, the roster, signing and verifying (Ed25519 through cryptography)."""

from __future__ import annotations

import json
import os
import stat

import pytest

from seedflood.comm import identity
from seedflood.comm.identity import IdentityError, PublicRoster


@pytest.fixture
def keys(tmp_path):
    identity.write_keys(tmp_path / "k", 3)
    return tmp_path / "k"


def test_write_keys_writes_private_keys_for_their_owner_only_and_a_roster_of_public_ones(keys):
    for i in range(3):
        assert stat.S_IMODE(identity.key_file(keys, i).stat().st_mode) == 0o600
    d = json.loads((keys / identity.ROSTER).read_text())
    assert d["scheme"] == "ed25519" and d["nodes"] == 3 and len(set(d["public_keys"])) == 3
    roster = identity.load_roster(keys)
    assert len(roster) == 3 and roster == identity.load_roster(keys / identity.ROSTER)
    assert PublicRoster.from_hex(roster.hex()) == roster and len(roster.digest()) == 64
    assert not list(keys.glob("*.tmp"))


def test_a_signature_verifies_for_its_node_only_and_never_raises(keys):
    roster = identity.load_roster(keys)
    me = identity.load_identity(keys, 1, roster)
    sig = me.sign(b"payload")
    assert len(sig) == 64 and me.sign(b"payload") == sig  # Ed25519 is deterministic
    assert roster.verify(1, b"payload", sig)
    assert not roster.verify(0, b"payload", sig) and not roster.verify(2, b"payload", sig)
    assert not roster.verify(1, b"payloaD", sig)
    assert not roster.verify(1, b"payload", bytes([sig[0] ^ 1]) + sig[1:])
    assert not roster.verify(1, b"payload", sig[:63]) and not roster.verify(3, b"payload", sig)
    assert not roster.verify(-1, b"payload", sig)


def test_keys_are_not_overwritten_unless_forced(keys):
    before = (keys / identity.ROSTER).read_bytes()
    with pytest.raises(IdentityError, match="already holds keys"):
        identity.write_keys(keys, 3)
    identity.write_keys(keys, 3, force=True)
    assert (keys / identity.ROSTER).read_bytes() != before


def test_a_key_that_is_missing_not_this_nodes_or_readable_by_others_is_refused(keys, tmp_path):
    roster = identity.load_roster(keys)
    with pytest.raises(IdentityError, match="no public key"):
        identity.load_identity(keys, 3, roster)
    identity.key_file(keys, 2).unlink()
    with pytest.raises(IdentityError, match="cannot read its key"):
        identity.load_identity(keys, 2, roster)
    identity.key_file(keys, 2).write_bytes(identity.key_file(keys, 0).read_bytes())
    identity.key_file(keys, 2).chmod(0o600)
    with pytest.raises(IdentityError, match="node-2.key is not the key of node 2"):
        identity.load_identity(keys, 2, roster)
    identity.key_file(keys, 0).chmod(0o640)
    with pytest.raises(IdentityError, match="readable by others"):
        identity.load_identity(keys, 0, roster)
    (tmp_path / "bad.json").write_text('{"scheme": "rsa"}')
    with pytest.raises(IdentityError, match="not a roster"):
        identity.load_roster(tmp_path / "bad.json")
    with pytest.raises(IdentityError, match="cannot read the roster"):
        identity.load_roster(tmp_path / "nowhere")
    with pytest.raises(IdentityError, match="32 bytes"):
        PublicRoster.from_hex(["ab"])


def test_a_stale_temp_file_of_another_mode_is_never_reused_for_a_key(tmp_path):
    out = tmp_path / "k"
    out.mkdir()
    stale = out / "node-0.key.tmp"  # what an earlier writer would have left after a crash
    stale.write_bytes(b"")
    stale.chmod(0o644)
    identity.write_keys(out, 1)
    assert stat.S_IMODE(identity.key_file(out, 0).stat().st_mode) == 0o600
    assert sorted(p.name for p in out.iterdir()) == ["node-0.key", "node-0.key.tmp", "roster.json"]


def test_keys_are_created_private_whatever_the_umask(tmp_path):
    old = os.umask(0)
    try:
        identity.write_keys(tmp_path / "k", 1)
    finally:
        os.umask(old)
    assert stat.S_IMODE(identity.key_file(tmp_path / "k", 0).stat().st_mode) == 0o600


def test_forcing_fewer_nodes_removes_the_keys_the_new_roster_does_not_name(keys):
    (keys / "node-notes.key").write_text("not ours")
    identity.write_keys(keys, 2, force=True)
    assert sorted(p.name for p in keys.iterdir()) == ["node-0.key", "node-1.key", "node-notes.key", "roster.json"]
    roster = identity.load_roster(keys)
    assert len(roster) == 2 and identity.load_identity(keys, 1, roster).public == roster.keys[1]


def test_a_roster_whose_count_or_keys_are_wrong_is_refused(keys):
    d = json.loads((keys / identity.ROSTER).read_text())
    for change, words in [
        ({"nodes": 4}, "says 4 nodes but holds 3 public keys"),
        ({"public_keys": d["public_keys"][:2]}, "says 3 nodes but holds 2 public keys"),
        ({"public_keys": [*d["public_keys"][:2], 7]}, "every public key is a hex string"),
        ({"public_keys": [*d["public_keys"][:2], "zz" * 32]}, "not hex"),
    ]:
        (keys / "other.json").write_text(json.dumps({**d, **change}))
        with pytest.raises(IdentityError, match=words):
            identity.load_roster(keys / "other.json")
    (keys / "other.json").write_text("{")
    with pytest.raises(IdentityError, match="is not JSON"):
        identity.load_roster(keys / "other.json")
    with pytest.raises(IdentityError, match="32 bytes"):
        PublicRoster((bytes(32), bytes(31)))


def test_a_key_file_that_is_not_an_ed25519_pem_is_refused(keys):
    identity.key_file(keys, 1).write_text("not a key")
    with pytest.raises(IdentityError, match="not a PEM private key"):
        identity.load_identity(keys, 1, identity.load_roster(keys))


def test_the_roster_round_trips_through_hex_and_its_digest_names_its_keys_in_order(keys):
    roster = identity.load_roster(keys)
    again = PublicRoster.from_hex(roster.hex())
    assert again == roster and again.digest() == roster.digest() and hash(again) == hash(roster)
    assert roster.hex() == json.loads((keys / identity.ROSTER).read_text())["public_keys"]
    assert PublicRoster(roster.keys[::-1]).digest() != roster.digest()


def test_verify_parses_each_public_key_once(keys, monkeypatch):
    roster = identity.load_roster(keys)
    me = identity.load_identity(keys, 0, roster)
    parsed = []
    real = identity.Ed25519PublicKey

    class Counting:
        @staticmethod
        def from_public_bytes(data):
            parsed.append(data)
            return real.from_public_bytes(data)

    monkeypatch.setattr(identity, "Ed25519PublicKey", Counting)
    for n in range(5):
        assert roster.verify(0, b"m%d" % n, me.sign(b"m%d" % n))
    assert not roster.verify(1, b"m0", me.sign(b"m0"))
    assert parsed == [roster.keys[0], roster.keys[1]]
