"""A signed run's key files checked before any model loads (roles/identities.py): the preflight
checks every node-<i>.key its machine holds against the roster (`check_keys_here`), and each
client process its own (`check_own_key`). Real Ed25519 keys (comm/identity.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from seedflood.comm import identity
from seedflood.core.config import runconfig as config
from seedflood.roles.identities import check_keys_here, check_own_key


@pytest.fixture
def keys(tmp_path: Path) -> Path:
    identity.write_keys(tmp_path / "keys", 4)
    return tmp_path / "keys"


def test_every_key_file_here_is_checked_and_an_absent_one_is_not_looked_for(keys):
    roster = identity.load_roster(keys)
    assert check_keys_here(keys, roster) == 4
    assert check_keys_here(keys / identity.ROSTER, roster) == 4  # trust.keys may name the roster file
    (keys / "node-1.key").unlink()
    (keys / "node-3.key").unlink()
    assert check_keys_here(keys, roster) == 2  # those live on their nodes' machines
    shutil.copy2(keys / "node-0.key", keys / "node-9.key")  # no node of this roster: not a node's key
    assert check_keys_here(keys, roster) == 2


def test_another_nodes_key_another_rosters_key_and_an_open_key_are_refused(keys, tmp_path):
    roster = identity.load_roster(keys)
    shutil.copy2(keys / "node-3.key", keys / "node-0.key")
    with pytest.raises(
        identity.IdentityError, match=r"^node-0.key is not the key of node 0 in roster.json \(it is node 3's\)$"
    ):
        check_keys_here(keys, roster)
    identity.write_keys(tmp_path / "other", 4)
    shutil.copy2(tmp_path / "other" / "node-0.key", keys / "node-0.key")
    with pytest.raises(identity.IdentityError, match=r"^node-0.key is not the key of node 0 in roster.json$"):
        check_keys_here(keys, roster)
    (keys / "node-0.key").unlink()
    (keys / "node-2.key").chmod(0o644)
    with pytest.raises(identity.IdentityError, match="node-2.key is readable by others"):
        check_keys_here(keys, roster)


def test_a_client_checks_its_own_key_and_an_unsigned_run_none(keys):
    cfg = config.load(None, ["trust.sign=true", f"trust.keys={keys}"])
    for node in range(4):
        check_own_key(cfg, node)  # control: each node's own key passes
    shutil.copy2(keys / "node-2.key", keys / "node-1.key")
    with pytest.raises(identity.IdentityError, match=r"node-1.key is not the key of node 1 .*\(it is node 2's\)"):
        check_own_key(cfg, 1)
    (keys / "node-3.key").unlink()
    with pytest.raises(identity.IdentityError, match="node 3 cannot read its key"):
        check_own_key(cfg, 3)
    with pytest.raises(identity.IdentityError, match="node 4 has no public key in the roster"):
        check_own_key(cfg, 4)
    check_own_key(config.load(None, [f"trust.keys={keys / 'nowhere'}"]), 0)  # trust.sign off: nothing read
