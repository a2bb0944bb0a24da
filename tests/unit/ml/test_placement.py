"""The GPU plan (modelcheck.place, modelcheck.plan): which device each launched rank computes on
under model.device and eval.device, and what the plan says where GPUs are shared. The launched
path (every rank sets and builds on the planned device) is tests/e2e/test_gpu_placement.py."""

from __future__ import annotations

import pytest

from seedflood.core.config.configerror import ConfigError
from seedflood.core.config.systemsections import EvalConfig
from seedflood.ml import modelcheck
from seedflood.ml.sources import ModelError


def devices(model: str, evaluator: str, world: int, gpus: int, hosts: int = 1) -> list[list[str]]:
    return [[d for _, d in host] for host in modelcheck.plan(model, evaluator, world, gpus, hosts).hosts]


def test_the_default_is_the_placement_before_the_setting():
    """eval.device "" = every process by its local rank, as resolve_device always did."""
    for world, gpus in ((9, 8), (5, 4), (17, 3)):
        assert devices("cuda", "", world, gpus) == [[modelcheck.resolve_device("cuda", r, gpus) for r in range(world)]]
    assert devices("cpu", "", 5, 0) == [["cpu"] * 5]
    assert devices("cuda:2", "", 5, 4) == [["cuda:2"] * 5]


def test_the_evaluator_own_gpu_cpu_or_a_named_one():
    assert devices("cuda", "own", 9, 8) == [["cuda:0", *(f"cuda:{1 + c % 7}" for c in range(8))]]
    assert devices("cuda", "own", 5, 8) == [["cuda:0", "cuda:1", "cuda:2", "cuda:3", "cuda:4"]]
    assert devices("cuda", "cpu", 9, 8) == [["cpu", *(f"cuda:{c}" for c in range(8))]]
    assert devices("cuda", "cuda:3", 9, 8) == [["cuda:3", *(f"cuda:{c}" for c in range(8))]]
    assert devices("cpu", "cuda:0", 3, 1) == [["cuda:0", "cpu", "cpu"]]  # scoring on a GPU, clients on CPUs
    assert devices("cuda:1", "cpu", 3, 2) == [["cpu", "cuda:1", "cuda:1"]]


def test_hosts_split_as_torchrun_sh_and_only_the_evaluators_host_shifts():
    # 9 processes on 2 hosts: 5 + 4; host 1's clients (ranks 5..8, local ranks 0..3) follow model.device
    assert devices("cuda", "own", 9, 4, hosts=2) == [
        ["cuda:0", "cuda:1", "cuda:2", "cuda:3", "cuda:1"],
        ["cuda:0", "cuda:1", "cuda:2", "cuda:3"],
    ]
    assert devices("cuda", "cpu", 9, 4, hosts=2) == [
        ["cpu", "cuda:0", "cuda:1", "cuda:2", "cuda:3"],
        ["cuda:0", "cuda:1", "cuda:2", "cuda:3"],
    ]
    # a process is on the evaluator's host when its rank equals its local rank (contiguous ranks)
    assert modelcheck.place("cuda", "cpu", 6, 1, 4) == "cuda:1"
    assert modelcheck.place("cuda", "cpu", 1, 1, 4) == "cuda:0"


def test_the_plan_says_who_shares_what():
    shared = modelcheck.plan("cuda", "", 9, 8)  # 8 clients on 8 GPUs: client 7 beside the evaluator
    assert shared.notices == [
        "the evaluator shares cuda:0 with client 7 (eval.device=own gives it a GPU of its own, "
        "eval.device=cpu takes it off the GPUs)"
    ]
    assert shared.warnings == []
    assert shared.lines()[:3] == [
        "GPU plan: 9 processes on 1 host of 8 GPUs (client n is rank n+1)",
        "  cuda:0: evaluator, client 7",
        "  cuda:1: client 0",
    ]
    own = modelcheck.plan("cuda", "own", 9, 8)
    assert own.notices == []
    assert [w.split(":")[0] for w in own.warnings] == ["2 clients share cuda"]
    assert "2 clients share cuda:1 (clients 0, 7)" in own.warnings[0]
    assert modelcheck.plan("cuda", "cpu", 9, 8).notices == modelcheck.plan("cuda", "cpu", 9, 8).warnings == []
    pinned = modelcheck.plan("cuda:0", "", 5, 1)  # model.device names the GPU: sharing is asked for
    assert pinned.warnings == [] and pinned.lines()[1] == "  cuda:0: evaluator, clients 0-3"
    two = modelcheck.plan("cuda", "", 9, 4, hosts=2)
    assert two.lines()[0] == "GPU plan: 9 processes on 2 hosts of 4 GPUs each (client n is rank n+1)"
    assert "  host 1 cuda:0: client 4" in two.lines()
    assert two.warnings == [] and "the evaluator shares cuda:0 with client 3" in two.notices[0]
    (warning,) = modelcheck.plan("cuda", "own", 9, 4, hosts=2).warnings  # host 0: 4 clients on 3 GPUs
    assert warning.startswith("2 clients share cuda:1 on host 0 (clients 0, 3)")


def test_placements_that_cannot_be_are_one_line():
    errors = {
        ("cuda", "own", 5, 1): "eval.device=own needs at least 2 GPUs, 1 visible",
        ("cpu", "own", 5, 2): "eval.device=own needs model.device=cuda, got cpu",
        ("cuda", "cuda:4", 5, 4): r"eval.device is cuda:4 but only 4 GPU\(s\) exist",
        ("cpu", "cuda:0", 5, 0): "eval.device is cuda:0 but CUDA is not available",
        ("cuda", "", 5, 0): "model.device is cuda but CUDA is not available",
    }
    for args, message in errors.items():
        with pytest.raises(ModelError, match=f"^{message}$"):
            modelcheck.plan(*args)
    with pytest.raises(ModelError, match="^2 processes cannot fill 3 host"):
        modelcheck.plan("cuda", "", 2, 4, hosts=3)
    for bad in ("gpu", "cuda:", "cuda:x", "OWN", "cuda:-1"):
        with pytest.raises(ConfigError, match=r'^eval.device: must be "", own, cpu or cuda:K'):
            EvalConfig(device=bad)
    assert not modelcheck.needs_gpus("cpu", "") and not modelcheck.needs_gpus("cpu", "cpu")
    assert modelcheck.needs_gpus("cpu", "cuda:0") and modelcheck.needs_gpus("cuda", "cpu")
