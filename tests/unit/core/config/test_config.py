import dataclasses
import typing

import pytest

from seedflood.core.config import runconfig as config
from seedflood.core.config.configerror import ConfigError
from seedflood.core.config.systemsections import TrustConfig
from seedflood.core.config.trainsections import ZOConfig
from seedflood.core.config.yamlread import read_yaml


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
        (["zo.lrr=1"], "unknown key 'zo.lrr' (allowed in zo: aggregate, clip, direction, eps"),
        (["zoo.lr=1"], "unknown section 'zoo'"),
        (["zo.lr=fast"], "zo.lr: must be a number, got 'fast'"),
        (["run.steps=1.5"], "run.steps: must be an integer"),
        (["run.steps=true"], "run.steps: must be an integer"),
        (["zo.direction=adam"], "zo.direction: must be one of subcge, gaussian; got 'adam'"),
        (["run.steps=0"], "run.steps: must be >= 1, got 0"),
        (["run.step_delay_s=-0.1"], "run.step_delay_s: must be a finite number >= 0, got -0.1"),
        (["run.slow_nodes=[-1]"], "run.slow_nodes: must be node ids >= 0"),
        (["run.slow_nodes=[4]"], "run.slow_nodes: must name nodes in 0..3, got [4]"),
        (["run.node_delay_s={4: 0.1}"], "run.node_delay_s: must name nodes in 0..3, got [4]"),
        (["run.node_delay_s={1: -0.1}"], "run.node_delay_s: must map node ids >= 0 to finite seconds"),
        (["zo.eps=-1"], "zo.eps: must be > 0"),
        (["zo.clip=0.5"], "zo.clip: must be 0 (off) or a finite number >= 1 (below 1 the bound is under the median"),
        (["zo.clip=-1"], "zo.clip: must be 0 (off) or a finite number >= 1"),
        (["subspace.refresh=10", "subspace.merge_every=3"], "subspace.merge_every: must divide"),
        (["topology.p=2"], "topology.p: must be in [0, 1]"),
        (["trust.audit=1.5"], "trust.audit: must be a rate in [0, 1] (0 = off), got 1.5"),
        (["trust.audit=-0.1"], "trust.audit: must be a rate in [0, 1] (0 = off), got -0.1"),
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


# --- non-finite floats, duplicate keys, YAML 1.2 floats, strict types, exact one-line messages ---

FLOAT_KEYS = [
    f"{name}.{f.name}"
    for name, cls in config.SECTIONS.items()
    for f in dataclasses.fields(cls)
    if typing.get_type_hints(cls)[f.name] is float
]
NON_FINITE = {".inf": "inf", "-.inf": "-inf", ".nan": "nan", "1e400": "inf"}


def test_float_keys_cover_the_known_ones():
    assert {"zo.lr", "zo.eps", "transport.timeout_s", "flood.max_scalar", "topology.p"} <= set(FLOAT_KEYS)


@pytest.mark.parametrize("key", FLOAT_KEYS)
@pytest.mark.parametrize("text", list(NON_FINITE))
def test_non_finite_float_rejected_by_override(key, text):
    with pytest.raises(ConfigError) as e:
        config.load(None, [f"{key}={text}"])
    assert str(e.value) == f"{key}: must be a finite number, got {NON_FINITE[text]}"


@pytest.mark.parametrize("key", FLOAT_KEYS)
@pytest.mark.parametrize("text", list(NON_FINITE))
def test_non_finite_float_rejected_in_yaml(tmp_path, key, text):
    section, _, name = key.partition(".")
    p = tmp_path / "c.yaml"
    p.write_text(f"{section}:\n  {name}: {text}\n")
    with pytest.raises(ConfigError) as e:
        config.load(p)
    assert str(e.value) == f"{key}: must be a finite number, got {NON_FINITE[text]}"


def test_duplicate_section_in_yaml(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("zo:\n  lr: 5\nrun:\n  steps: 3\nzo:\n  eps: 0.1\n")
    with pytest.raises(ConfigError) as e:
        config.load(p)
    assert str(e.value) == f"{p}: line 5: duplicate key 'zo' (first at line 1)"


def test_duplicate_key_in_section(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("run:\n  steps: 3\nzo:\n  lr: 5\n  eps: 0.1\n  lr: 6\n")
    with pytest.raises(ConfigError) as e:
        config.load(p)
    assert str(e.value) == f"{p}: line 6: duplicate key 'zo.lr' (first at line 4)"


def test_duplicate_key_in_flow_mapping_and_override(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("model: {tiny: {hidden_size: 8, hidden_size: 16}}\n")
    with pytest.raises(ConfigError, match=r"line 1: duplicate key 'model.tiny.hidden_size'"):
        config.load(p)
    with pytest.raises(ConfigError) as e:
        config.load(None, ["model.tiny={a: 1, a: 2}"])
    assert str(e.value) == "model.tiny: value '{a: 1, a: 2}' has duplicate key 'model.tiny.a'"


def test_read_yaml_duplicates_use_the_callers_error(tmp_path):
    class OtherError(ConfigError):
        pass

    p = tmp_path / "s.yaml"
    p.write_text("axes:\n  zo.lr: [1, 2]\n  zo.lr: [3]\n")
    with pytest.raises(OtherError, match=r"line 3: duplicate key 'axes.zo.lr' \(first at line 2\)"):
        read_yaml(p, "sweep file", OtherError)


def test_merge_keys_and_aliases_are_not_duplicates(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("base: &b {lr: 5, eps: 0.1}\nzo:\n  <<: *b\n  lr: 6\nself: &s [1, *s]\n")
    data = read_yaml(p)
    assert data["zo"] == {"lr": 6, "eps": 0.1}


def test_exponent_without_dot_is_a_float(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("zo:\n  eps: 1e-3\n  lr: 2E1\nflood:\n  max_scalar: 1e6\n")
    cfg = config.load(p)
    assert cfg.zo.eps == 1e-3 and cfg.zo.lr == 20.0 and cfg.flood.max_scalar == 1e6
    assert all(isinstance(v, float) for v in (cfg.zo.eps, cfg.zo.lr, cfg.flood.max_scalar))
    assert read_yaml(p)["zo"]["eps"] == 1e-3  # every read_yaml reader gets floats
    assert config.parse_override("zo.eps=1e-3") == ("zo", "eps", 1e-3)
    assert config.parse_override("zo.eps=.5e-2") == ("zo", "eps", 0.005)
    assert config.parse_override("run.out_dir=1e") == ("run", "out_dir", "1e")


@pytest.mark.parametrize(
    "override, message",
    [
        ("run.steps=1.5", "run.steps: must be an integer, got 1.5"),
        ("run.steps=true", "run.steps: must be an integer, got True"),
        ("run.steps='3'", "run.steps: must be an integer, got '3'"),
        ("run.steps=1e3", "run.steps: must be an integer, got 1000.0"),
        ("zo.lr=true", "zo.lr: must be a number, got True"),
        ("zo.lr=inf", "zo.lr: must be a number, got 'inf'"),
        ("zo.lr='1e-3'", "zo.lr: must be a number, got '1e-3'"),
        ("checkpoint.hf_model=1", "checkpoint.hf_model: must be true or false, got 1"),
        ("checkpoint.hf_model='true'", "checkpoint.hf_model: must be true or false, got 'true'"),
        ("flood.overlap=1", "flood.overlap: must be true or false, got 1"),
        ("run.out_dir=3", "run.out_dir: must be a string, got 3"),
        ("zo.trainable=x", "zo.trainable: must be a list of str, got 'x'"),
        ("zo.trainable=[a, 3]", "zo.trainable[1]: must be a string, got 3"),
        ("model.tiny={hidden_size: 1.5}", "model.tiny.hidden_size: must be an integer, got 1.5"),
        ("model.tiny={1: 2}", "model.tiny: keys must be a string, got 1"),
        ("task.data_files=[a]", "task.data_files: must be a mapping, got ['a']"),
        ("zo.direction=adam", "zo.direction: must be one of subcge, gaussian; got 'adam'"),
        ("model.dtype=int8", "model.dtype: must be one of float32, bfloat16, float16; got 'int8'"),
        (
            "zo.lrr=1",
            "unknown key 'zo.lrr' (allowed in zo: aggregate, clip, direction, eps, lr, perturbations, "
            "schedule, stride, trainable, warmup_steps)",
        ),
        ("zo.eps=-1", "zo.eps: must be > 0, got -1.0"),
        ("zo.lr=.nan", "zo.lr: must be a finite number, got nan"),
        ("run.steps=0", "run.steps: must be >= 1, got 0"),
        ("topology.p=2", "topology.p: must be in [0, 1], got 2.0"),
        ("subspace.rank=0", "subspace.rank: must be in 1..4096, got 0"),
    ],
)
def test_exact_messages(override, message):
    with pytest.raises(ConfigError) as e:
        config.load(None, [override])
    assert str(e.value) == message


def test_signing_needs_the_keys_directory_and_the_config_layer_reads_no_file():
    with pytest.raises(ConfigError) as e:
        config.load(None, ["trust.sign=true"])
    assert str(e.value) == (
        "trust.keys: needed when trust.sign is true: the directory `seedflood keys --nodes N --out DIR` writes"
    )
    with pytest.raises(ConfigError, match=r"^trust.sign: must be true or false, got 'yes please'$"):
        config.load(None, ["trust.sign='yes please'"])
    with pytest.raises(
        ConfigError, match=r"^unknown key 'trust.key' \(allowed in trust: audit, audit_tolerance, keys, sign\)$"
    ):
        config.load(None, ["trust.key=/k"])
    cfg = config.load(None, ["trust.sign=true", "trust.keys=/no/such/dir"])  # the preflight reads it
    assert cfg.trust.sign is True and cfg.trust.keys == "/no/such/dir"
    assert config.load(None).trust == TrustConfig(sign=False, keys="")


def test_int_into_float_field_becomes_float_and_yes_is_a_bool():
    cfg = config.load(None, ["zo.lr=5", "transport.timeout_s=30", "checkpoint.resume=no"])
    assert cfg.zo.lr == 5.0 and type(cfg.zo.lr) is float and type(cfg.transport.timeout_s) is float
    assert cfg.checkpoint.resume is False


def test_first_bad_key_as_written_is_reported():
    with pytest.raises(ConfigError, match=r"^zo.lr: must be a number"):
        config.from_dict({"zo": {"lr": "x", "eps": "y", "nope": 1}})
    with pytest.raises(ConfigError, match=r"^unknown key 'zo.nope'"):
        config.from_dict({"zo": {"nope": 1, "lr": "x"}})


def test_sections_built_in_code_still_check_ranges():
    with pytest.raises(ConfigError, match=r"^zo.eps: must be > 0, got -1$"):
        ZOConfig(eps=-1)


BAD_INPUTS = [
    ["zo.x\ny=1"],
    ['run.out_dir="a\\nb"', "run.steps=0"],
    ["zo.lr=[1,"],
    ["zo.lr=.inf"],
    ['model.device="tp\\nu"'],
    ["zo.trainable=[]"],
    ["eval.attach=9"],
    ["topology.kind=file"],
]


@pytest.mark.parametrize("overrides", BAD_INPUTS)
def test_every_error_is_exactly_one_line(overrides):
    with pytest.raises(ConfigError) as e:
        config.load(None, overrides)
    assert len(str(e.value).splitlines()) == 1 and "\n" not in str(e.value) and "\r" not in str(e.value)
    assert "pydantic" not in str(e.value) and "Value error" not in str(e.value)


def test_yaml_errors_are_one_line(tmp_path):
    p = tmp_path / "c.yaml"
    for text in ("zo:\n  lr: [1,\n", "zo:\n  lr: 1\n  lr: 2\n", '"a\\nb":\n  c: 1\n'):
        p.write_text(text)
        with pytest.raises(ConfigError) as e:
            config.load(p)
        assert len(str(e.value).splitlines()) == 1


def test_every_setting_changed_round_trips(tmp_path):
    overrides = [
        "run.seed=7",
        "run.steps=3",
        "run.out_dir=x/y",
        "run.threads=2",
        "run.log_level=debug",
        "run.hash_steps=true",
        "run.step_delay_s=0.05",
        "run.slow_nodes=[1, 2]",
        "run.node_delay_s={1: 0.25}",
        "zo.direction=gaussian",
        "zo.eps=1e-7",
        "zo.lr=0.25",
        "zo.schedule=cosine",
        "zo.warmup_steps=1",
        "zo.aggregate=mean",
        "zo.perturbations=2",
        "zo.trainable=['a.*']",
        "zo.clip=5",
        "zo.stride={1: 3}",
        "subspace.rank=4",
        "subspace.refresh=10",
        "subspace.merge_every=5",
        "subspace.forward=lowrank",
        "flood.hops_per_step=1",
        "flood.max_scalar=12.5",
        "flood.step_window=3",
        "flood.overlap=true",
        "topology.kind=torus",
        "topology.nodes=9",
        "topology.rows=3",
        "topology.degree=2",
        "topology.p=0.5",
        "topology.k=3",
        "topology.seed=1",
        "topology.file=t.yaml",
        "task.name=synthetic",
        "task.data_files={train: a.csv}",
        "task.train_examples=5",
        "task.dev_examples=1",
        "task.test_examples=2",
        "task.batch_size=2",
        "task.max_tokens=8",
        "task.split=dirichlet",
        "task.alpha=2.0",
        "task.template='{sentence} It was'",
        "task.candidates=[' bad', ' good']",
        "task.text_fields=[sentence]",
        "task.label_field=y",
        "task.label_values=[neg, pos]",
        "model.name=tiny",
        "model.gguf_file=m.gguf",
        "model.dtype=bfloat16",
        "model.device=cuda:1",
        "model.tiny={hidden_size: 16}",
        "eval.every=0",
        "eval.trackers=[mlflow, wandb]",
        "eval.batch_size=4",
        "eval.attach=8",
        "eval.client_logs=/elsewhere/logs",
        "eval.device=own",
        "checkpoint.every=0",
        "checkpoint.hf_model=false",
        "checkpoint.resume=false",
        "transport.timeout_s=1e3",
        "transport.startup_timeout_s=30",
        "algorithm.name=diloco",
        "algorithm.lr=1e-4",
        "algorithm.gossip_every=2",
        "algorithm.wire=counted",
        "algorithm.gamma=0.25",
        "algorithm.topk=0.5",
        "algorithm.inner_steps=3",
        "algorithm.outer_lr=0.5",
        "algorithm.outer_momentum=0.5",
        "algorithm.compress=int8",
        "algorithm.overlap=true",
        "algorithm.lora_rank=4",
        "algorithm.lora_alpha=8.0",
        "algorithm.lora_targets=[q_proj]",
        "churn.settle=2",
        "churn.audit_every=5",
        "churn.max_nodes=12",
        "churn.repair=true",
        "churn.log_server=logs.example:29600",
        "trust.sign=true",
        "trust.keys=/keys",
        "trust.audit=0.5",
        "trust.audit_tolerance=1e-5",
        "sim.batched=true",
        "sim.clients_per_forward=3",
    ]
    cfg = config.load(None, overrides)
    changed = config.flat(cfg.to_dict())
    defaults = config.flat(config.Config().to_dict())
    assert {k for k in defaults if changed[k] == defaults[k]} == set()  # no key with one allowed value
    p = tmp_path / "c.yaml"
    p.write_text(config.dump(cfg))
    assert config.load(p) == cfg


REMOVED_LINE = "transport.backend: no longer a setting (gloo is the only transport); delete it from the config"


def test_a_removed_key_is_refused_in_one_line_saying_to_delete_it(tmp_path):
    """transport.backend had one allowed value and was read nowhere else: a config or
    override that still sets it is told what to do."""
    p = tmp_path / "old.yaml"
    p.write_text("transport:\n  backend: gloo\n  timeout_s: 10\n")
    for load in (lambda: config.load(p), lambda: config.load(None, ["transport.backend=gloo"])):
        with pytest.raises(ConfigError) as e:
            load()
        assert str(e.value) == REMOVED_LINE
    for key in config.REMOVED:  # named as --set names them, in a section that no longer has it
        section, _, name = key.partition(".")
        assert name not in {f.name for f in dataclasses.fields(config.SECTIONS[section])}


def test_a_recorded_config_yaml_holding_a_removed_key_at_its_only_value_still_loads(tmp_path):
    """A run directory written before the key went cannot be edited into agreement with its log:
    its config.yaml loads (the key changed nothing), unless it holds a value the key never allowed."""
    p = tmp_path / "config.yaml"
    p.write_text("transport:\n  backend: gloo\n  timeout_s: 10\n")
    assert config.load(p, recorded=True).transport.timeout_s == 10
    p.write_text("transport:\n  backend: nccl\n")
    with pytest.raises(ConfigError, match="transport.backend: no longer a setting"):
        config.load(p, recorded=True)


def test_a_removed_key_exits_2_from_the_command_line(tmp_path, capsys):
    from seedflood import cli

    p = tmp_path / "old.yaml"
    p.write_text("transport: {backend: gloo}\n")
    assert cli.main(["world-size", "--config", str(p)]) == 2
    got = capsys.readouterr()
    assert got.out == "" and got.err == f"seedflood: error: {REMOVED_LINE}\n"


def test_flat():
    assert config.flat({"zo": {"lr": 1.0, "eps": 2.0}, "model": {"tiny": {"a": 1}}, "run": {}}) == {
        "zo.lr": 1.0,
        "zo.eps": 2.0,
        "model.tiny": {"a": 1},
    }
    keys = config.flat(config.Config().to_dict())
    assert len(keys) == sum(len(dataclasses.fields(c)) for c in config.SECTIONS.values())
    assert all(config.parse_override(f"{k}=1")[:2] == tuple(k.split(".")) for k in keys)


@pytest.mark.parametrize(
    "value, why",
    [
        ("logs:0", "must be HOST:PORT"),
        ("logs", "must be HOST:PORT"),
        (":29600", "must be HOST:PORT"),
        ("h:p", "HOST:PORT"),
        ("log host:29600", "must be HOST:PORT"),
    ],
)
def test_a_log_server_that_is_not_host_port_or_outside_a_churn_run_is_refused_in_one_line(value, why):
    with pytest.raises(ConfigError, match=why):
        config.load(None, ["churn.settle=1", f"churn.log_server={value}"])
    with pytest.raises(ConfigError, match="needs churn.settle >= 1"):
        config.load(None, ["churn.log_server=logs:29600"])
    assert config.load(None, ["churn.settle=1", "churn.log_server=logs:29600"]).churn.log_server == "logs:29600"
