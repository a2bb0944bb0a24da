import pytest

from seedflood import config
from seedflood.config import ConfigError


def test_defaults_validate_and_round_trip(tmp_path):
    cfg = config.load()
    assert cfg.zo.direction == "subcge" and cfg.topology.kind == "ring"
    p = tmp_path / "c.yaml"
    p.write_text(config.dump(cfg))
    assert config.load(p) == cfg


def test_yaml_and_overrides(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("zo:\n  lr: 5\ntopology:\n  kind: grid\n  nodes: 9\n")
    cfg = config.load(p, ["zo.lr=0.5", "run.steps=7", "zo.trainable=['a.*', 'b.*']", "model.tiny={hidden_size: 32}"])
    assert cfg.zo.lr == 0.5 and isinstance(cfg.zo.lr, float)
    assert cfg.run.steps == 7 and cfg.topology.kind == "grid" and cfg.topology.nodes == 9
    assert cfg.zo.trainable == ["a.*", "b.*"] and cfg.model.tiny == {"hidden_size": 32}
    assert cfg.source == str(p.resolve())
    assert config.load(None, ["zo.lr=1e-3"]).zo.lr == 1e-3  # YAML 1.1 reads 1e-3 as text


@pytest.mark.parametrize(
    "overrides, words",
    [
        (["zo.lrr=1"], "unknown key 'zo.lrr' (allowed in zo: aggregate, direction, eps"),
        (["zoo.lr=1"], "unknown section 'zoo'"),
        (["zo.lr=fast"], "zo.lr: must be a number, got 'fast'"),
        (["run.steps=1.5"], "run.steps: must be an integer"),
        (["run.steps=true"], "run.steps: must be an integer"),
        (["zo.direction=adam"], "zo.direction: must be one of subcge, gaussian; got 'adam'"),
        (["run.steps=0"], "run.steps: must be >= 1, got 0"),
        (["zo.eps=-1"], "zo.eps: must be > 0"),
        (["subspace.refresh=10", "subspace.merge_every=3"], "subspace.merge_every: must divide"),
        (["topology.p=2"], "topology.p: must be in [0, 1]"),
        (["eval.attach=4"], "eval.attach: must name a node in 0..3"),
        (["checkpoint.hf_model=yes please"], "checkpoint.hf_model: must be true or false"),
        (["zo.trainable=x"], "zo.trainable: must be a list"),
        (["lr=1"], "must look like section.field=value"),
        (["model.device=tpu"], "model.device: must be cpu, cuda or cuda:N"),
    ],
)
def test_bad_values_give_one_clear_line(overrides, words):
    with pytest.raises(ConfigError) as e:
        config.load(None, overrides)
    assert words in str(e.value)
    assert "\n" not in str(e.value)


def test_bad_files(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        config.load(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("zo: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        config.load(bad)
    bad.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="must be a mapping"):
        config.load(bad)
    bad.write_text("zo: 3\n")
    with pytest.raises(ConfigError, match="zo: must be a mapping"):
        config.load(bad)
