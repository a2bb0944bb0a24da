"""comm/identity.py: key files, the roster, signing and verifying (Ed25519 through cryptography)."""

from __future__ import annotations

import json
import stat
import subprocess
import sys

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


def test_seedflood_keys_writes_them_and_refuses_bad_input_in_one_line(tmp_path):
    def keys(*args):
        return subprocess.run(
            [sys.executable, "-m", "seedflood", "keys", *args], capture_output=True, text=True, timeout=120
        )

    ok = keys("--nodes", "2", "--out", str(tmp_path / "k"))
    assert ok.returncode == 0 and "trust.keys=" in ok.stdout and len(identity.load_roster(tmp_path / "k")) == 2
    for args, words in [
        (("--nodes", "2", "--out", str(tmp_path / "k")), "already holds keys"),
        (("--nodes", "0", "--out", str(tmp_path / "j")), "must be in 1..100000"),
    ]:
        p = keys(*args)
        assert p.returncode == 2 and p.stderr.count("\n") == 1 and words in p.stderr, p.stderr


def test_world_size_refuses_a_signed_run_without_keys_or_with_a_roster_of_another_size(tmp_path):
    from pathlib import Path

    debug = Path(__file__).resolve().parents[3] / "launch" / "configs" / "debug.yaml"
    identity.write_keys(tmp_path / "k3", 3)

    def world_size(*sets):
        args = [a for s in sets for a in ("--set", s)]
        return subprocess.run(
            [sys.executable, "-m", "seedflood", "world-size", "--config", str(debug), *args],
            capture_output=True,
            text=True,
            timeout=120,
        )

    p = world_size("trust.sign=true")
    assert p.returncode == 2 and "trust.keys: needed when trust.sign is true" in p.stderr, p.stderr
    p = world_size("trust.sign=true", f"trust.keys={tmp_path / 'k3'}")  # the debug run has 4 clients
    assert p.returncode == 2 and "holds 3 public keys, the run has 4 clients" in p.stderr, p.stderr
    identity.write_keys(tmp_path / "k4", 4)
    p = world_size("trust.sign=true", f"trust.keys={tmp_path / 'k4'}")
    assert p.returncode == 0 and p.stdout.strip() == "5", p.stderr
