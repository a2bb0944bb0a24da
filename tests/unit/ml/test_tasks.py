"""tasks, sampling, encoding, datafiles: registry, splits, shards, batches, encoding, local data files (tiny tokenizer)."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest
import torch

from seedflood.core.config.trainsections import TaskConfig
from seedflood.ml import datafiles, encoding, sampling, tasks
from seedflood.ml.sources import tiny_tokenizer


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


def small(name: str = "synthetic", **kw) -> TaskConfig:
    return TaskConfig(name=name, **{"train_examples": 40, "dev_examples": 10, "test_examples": 20, **kw})


def texts(examples):
    return [e.fields["sentence"] for e in examples]


def test_registry_and_unknown_task():
    assert {"rt", "sst2", "rte", "cb", "boolq", "wic", "multirc", "copa", "synthetic", "table"} <= set(tasks.TASKS)
    assert tasks.get("rt").candidates == (" terrible", " great")
    registered = "boolq, cb, copa, multirc, rt, rte, sst2, synthetic, table, wic"
    with pytest.raises(datafiles.TaskError, match=rf"unknown task 'nope' \(registered: {registered}\)$"):
        tasks.get("nope")
    with pytest.raises(
        datafiles.TaskError, match=r"unknown task 'jsonl' .*\(your own csv/jsonl files: task.name: table\)$"
    ):
        tasks.get("jsonl")


def test_mezo_templates():
    assert tasks.get("sst2").template({"sentence": "A fine film."}) + " great" == "A fine film. It was great"
    rte = tasks.get("rte")
    assert rte.template({"premise": "P.", "hypothesis": "H"}) + rte.candidates[0] == (
        'P.\nDoes this mean that "H" is true? Yes or No?\nYes'
    )
    boolq = tasks.get("boolq")
    prompt = boolq.template({"passage": "Text.", "question": "is it true"})
    assert prompt + boolq.candidates[1] == "Text. Is it true?\nYes"


def test_synthetic_splits_are_deterministic_and_learnable():
    a, b = sampling.load_splits(small(), 3), sampling.load_splits(small(), 3)
    assert a == b
    assert (len(a.train), len(a.dev), len(a.test)) == (40, 10, 20)
    assert texts(sampling.load_splits(small(), 4).train) != texts(a.train)
    assert not set(texts(a.train)) & set(texts(a.dev))
    for e in a.train + a.test:  # the label is the majority sentiment of the words
        words = e.fields["sentence"].split()
        pos = sum(w in tasks._POS for w in words)
        neg = sum(w in tasks._NEG for w in words)
        assert e.label == int(pos > neg) and (pos + neg) % 2 == 1


def test_rt_splits_disjoint_and_balanced_enough():
    cfg = TaskConfig(name="rt", train_examples=300, dev_examples=100, test_examples=200)
    s = sampling.load_splits(cfg, 0)
    assert (len(s.train), len(s.dev), len(s.test)) == (300, 100, 200)
    train, dev, test = map(set, (texts(s.train), texts(s.dev), texts(s.test)))
    assert len(train) == 300 and not (train & dev or train & test or dev & test)
    assert 0.4 < sum(e.label for e in s.test) / len(s.test) < 0.75  # fresh ≈ 58% of the corpus
    assert sampling.load_splits(cfg, 0) == s
    with pytest.raises(datafiles.TaskError, match="takes no task.data_files"):
        sampling.load_splits(dataclasses.replace(cfg, data_files={"train": "x.csv"}), 0)


def test_shards_partition_the_train_set():
    train = sampling.load_splits(small(train_examples=43), 0).train
    shards = [sampling.shard(train, c, 4) for c in range(4)]
    assert sorted(texts(sum(shards, []))) == sorted(texts(train))
    assert {len(s) for s in shards} == {10, 11}
    with pytest.raises(datafiles.TaskError, match="not in 0..3"):
        sampling.shard(train, 4, 4)
    with pytest.raises(datafiles.TaskError, match="cannot be shared"):
        sampling.shard(train[:3], 0, 4)


def test_batches_are_pure_functions_of_seed_client_step():
    shard = sampling.shard(sampling.load_splits(small(), 0).train, 1, 2)
    b = sampling.batch_examples(shard, 7, 1, 5, 8)
    assert b == sampling.batch_examples(shard, 7, 1, 5, 8)
    assert len(b) == 8 and len(set(texts(b))) == 8
    assert b != sampling.batch_examples(shard, 7, 1, 6, 8)
    assert b != sampling.batch_examples(shard, 7, 0, 5, 8)
    assert b != sampling.batch_examples(shard, 8, 1, 5, 8)
    assert sorted(texts(sampling.batch_examples(shard, 7, 1, 5, 1000))) == sorted(texts(shard))


def test_encode_shapes_and_option_positions(tok):
    examples = sampling.load_splits(small(), 0).train[:5]
    spec = dataclasses.replace(tasks.get("synthetic"), candidates=(" no", " yes", "!"))
    batch = encoding.encode(examples, spec, tok, 64)
    b, t = batch.input_ids.shape
    assert b == 5 and batch.labels.tolist() == [e.label for e in examples]
    assert batch.attention_mask.sum(1).tolist() == batch.lengths.tolist() and t == max(batch.lengths)
    for i, e in enumerate(examples):
        n = int(batch.lengths[i])
        assert batch.input_ids[i, :n].tolist() == tok(spec.template(e.fields))["input_ids"]
        assert (batch.input_ids[i, n:] == tok.pad_token_id).all()
    assert batch.option_mask.sum(1).tolist() == [3, 4, 1] and not batch.single_token
    ids, mask, pos = batch.expand()
    assert ids.shape == (15, t + 4) and pos.shape == (15, 4)
    for r in range(15):
        c, n = r % 3, int(batch.lengths[r // 3])
        opt = tok(spec.candidates[c], add_special_tokens=False)["input_ids"]
        assert ids[r, pos[r, : len(opt)] + 1].tolist() == opt
        assert ids[r, : n + len(opt)].tolist() == batch.input_ids[r // 3, :n].tolist() + opt
        assert mask[r].sum() == n + len(opt) and mask[r, : n + len(opt)].all()
    assert encoding.encode(examples, tasks.get("synthetic"), tok, 64).single_token


def test_encode_cuts_the_text_before_the_template(tok):
    spec = tasks.get("sst2")
    long = datafiles.Example({"sentence": "abcdefghijklmnopqrstuvwxyz"}, 1)
    batch = encoding.encode([long], spec, tok, 10)  # byte tokenizer: 10 tokens = 10 characters
    assert tok.decode(batch.input_ids[0], skip_special_tokens=True) == "abcdefghij It was"
    assert encoding.encode([long], spec, tok, 10).input_ids.equal(batch.input_ids)


def write_csv(path, header, rows):
    path.write_text("\n".join([",".join(header)] + [",".join(map(str, r)) for r in rows]) + "\n")
    return str(path)


def test_local_files(tmp_path):
    train = write_csv(tmp_path / "train.csv", ["sentence", "label"], [(f"good {i}", i % 2) for i in range(30)])
    test = write_csv(tmp_path / "test.csv", ["sentence", "label"], [(f"ok {i}", "positive") for i in range(8)])
    s = sampling.load_splits(small("sst2", data_files={"train": train, "test": test}), 0)
    assert (len(s.train), len(s.dev), len(s.test)) == (30, 0, 8)  # capped: only 30 train rows
    assert {e.label for e in s.test} == {1}

    rte = tmp_path / "rte.tsv"
    rte.write_text('sentence1\tsentence2\tlabel\nA "quote.\tB\tentailment\nC\tD\tnot_entailment\n')
    s = sampling.load_splits(small("rte", data_files={"train": str(rte), "validation": str(rte)}), 0)
    assert sorted((e.fields["premise"], e.label) for e in s.test) == [('A "quote.', 0), ("C", 1)]

    boolq = tmp_path / "boolq.jsonl"
    boolq.write_text("\n".join(json.dumps({"passage": "p", "question": "q", "answer": a}) for a in (True, False)))
    s = sampling.load_splits(small("boolq", data_files={"train": str(boolq), "test": str(boolq)}), 0)
    assert sorted(e.label for e in s.test) == [0, 1]


def test_bad_data_files(tmp_path):
    good = write_csv(tmp_path / "good.csv", ["sentence", "label"], [("a", 0)])
    cases = {
        "does not exist": {"train": str(tmp_path / "missing.csv"), "test": good},
        "missing column sentence or text": {
            "train": write_csv(tmp_path / "cols.csv", ["review", "label"], [("a", 0)]),
            "test": good,
        },
        r"row 1: label 'maybe' is not one of 0..1": {
            "train": write_csv(tmp_path / "lab.csv", ["sentence", "label"], [("a", 0), ("b", "maybe")]),
            "test": good,
        },
        "needs keys train and test": {"train": good},
        "unsupported format": {"train": write_csv(tmp_path / "x.txt", ["a"], []), "test": good},
    }
    for message, files in cases.items():
        with pytest.raises(datafiles.TaskError, match=message):
            sampling.load_splits(small("sst2", data_files=files), 0)


@pytest.mark.skipif(os.environ.get("HF_HUB_OFFLINE") != "1", reason="needs HF_HUB_OFFLINE=1 (no network)")
def test_hub_unavailable_offline():
    with pytest.raises(datafiles.TaskError, match="set task.data_files"):
        sampling.load_splits(small("rte"), 0)


def test_local_formats_read_like_the_csv(tmp_path):
    """parquet, a JSON array, gzip/xz-compressed files and "NA"/"null" texts all give the same rows."""
    import gzip
    import lzma

    import pandas as pd

    rows = [{"sentence": s, "label": i % 2} for i, s in enumerate(["NA", "null", "a, b", 'say "hi"', "5"])]
    pd.DataFrame(rows).to_parquet(tmp_path / "t.parquet")
    (tmp_path / "t.json").write_text(json.dumps(rows))
    with gzip.open(tmp_path / "t.csv.gz", "wt") as f:
        pd.DataFrame(rows).to_csv(f, index=False)
    with lzma.open(tmp_path / "t.jsonl.xz", "wt") as f:
        f.write("\n".join(map(json.dumps, rows)))
    want = [(r["sentence"], r["label"]) for r in rows]
    for name in ("t.parquet", "t.json", "t.csv.gz", "t.jsonl.xz"):
        files = {"train": str(tmp_path / name), "test": str(tmp_path / name)}
        s = sampling.load_splits(small("sst2", data_files=files, test_examples=100), 0)
        assert sorted((e.fields["sentence"], e.label) for e in s.test) == sorted(want), name


def test_label_column_may_change_type_late_in_a_csv(tmp_path):
    """Numeric labels for 12,000 rows, then a label name: the file's types are inferred once."""
    lines = ["sentence,label"] + [f"s{i},{i % 2}" for i in range(12_000)] + ["last,positive"]
    (tmp_path / "big.csv").write_text("\n".join(lines) + "\n")
    files = {"train": str(tmp_path / "big.csv"), "test": str(tmp_path / "big.csv")}
    s = sampling.load_splits(small("sst2", data_files=files, test_examples=20_000), 0)
    assert len(s.test) == 12_001 and {e.label for e in s.test if e.fields["sentence"] == "last"} == {1}


def test_data_file_errors_are_one_line(tmp_path):
    good = write_csv(tmp_path / "good.csv", ["sentence", "label"], [("a", 0)])
    (tmp_path / "broken.json").write_text("{not json")
    (tmp_path / "header.csv").write_text("sentence,label\n")
    (tmp_path / "broken.parquet").write_text("not parquet")
    cases = {
        "broken.json": r"data file \S+broken.json cannot be read as json: ",
        "header.csv": r"data file \S+header.csv has no rows$",
        "broken.parquet": r"data file \S+broken.parquet cannot be read as parquet: ",
    }
    for name, message in cases.items():
        with pytest.raises(datafiles.TaskError, match=message) as info:
            sampling.load_splits(small("sst2", data_files={"train": str(tmp_path / name), "test": good}), 0)
        assert "\n" not in str(info.value)


def test_check_accepts_runnable_configs():
    assert sampling.check(small(train_examples=4), 0, 4) == sampling.load_splits(
        small(train_examples=4), 0
    )  # one each is enough
    sampling.check(TaskConfig(name="rt"), 0, 16)  # the defaults, as the preflight of a real run


def test_check_rejects_what_would_fail_after_launch(tmp_path):
    train = write_csv(tmp_path / "train.csv", ["sentence", "label"], [(f"s{i}", i % 2) for i in range(3)])
    test = write_csv(tmp_path / "test.csv", ["sentence", "label"], [("t", 0)])
    files = {"train": train, "test": test}
    cases = [  # (config, clients, message)
        (small(train_examples=2), 4, r"^task synthetic: task.train_examples=2 is fewer than the 4 clients"),
        (
            small("sst2", data_files=files, dev_examples=0),
            4,
            r"^task sst2: only 3 training examples are available for 4",
        ),
        (small(test_examples=0), 2, r"^task synthetic: task.test_examples is 0 but the evaluator needs"),
        (
            small("sst2", data_files=files, train_examples=3, dev_examples=5),
            3,
            r"^task sst2: task.dev_examples=5 but no examples are left for dev after 3 train examples",
        ),
        (small("sst2", data_files={**files, "test": str(tmp_path / "none.csv")}), 2, r"none.csv does not exist"),
        (
            small(
                "sst2", data_files={**files, "train": write_csv(tmp_path / "c.csv", ["review", "label"], [("a", 0)])}
            ),
            1,
            "missing column sentence or text",
        ),
        (
            small("sst2", data_files={**files, "test": write_csv(tmp_path / "l.csv", ["text", "label"], [("a", "x")])}),
            2,
            r"row 0: label 'x' is not one of 0..1",
        ),
    ]
    for cfg, clients, message in cases:
        with pytest.raises(datafiles.TaskError, match=message) as info:
            sampling.check(cfg, 0, clients)
        assert "\n" not in str(info.value)
    sampling.check(small("sst2", data_files=files, dev_examples=0), 0, 3)  # 3 clients: one row each


def _same_batch(a: encoding.Batch, b: encoding.Batch) -> bool:
    return a.per_example == b.per_example and all(torch.equal(x, y) for x, y in zip(a._tensors(), b._tensors()))


@pytest.mark.parametrize("per_example", [False, True], ids=["fixed-candidates", "own-candidates"])
def test_tokenize_each_example_alone_then_collate_equals_encode(tok, per_example):
    """encode = collate(tokenize): tokenizing one example at a time (what a client caches per
    shard example) gives the batch encoding the examples together gives, truncation included."""
    spec = dataclasses.replace(tasks.get("synthetic"), truncate=("sentence",))
    if per_example:
        spec = dataclasses.replace(spec, choices=lambda f: (" " + f["sentence"][:3], " no"))
    examples = sampling.load_splits(small(), 0).train[:12]
    whole = encoding.encode(examples, spec, tok, 6)  # 6 tokens: most sentences are cut
    alone = [encoding.tokenize([e], spec, tok, 6)[0] for e in examples]
    assert _same_batch(encoding.collate(alone, spec, tok), whole)


def test_a_workloads_batches_equal_encoding_the_drawn_examples(tmp_path):
    """Workload.batch tokenizes each shard example once and collates per step: every batch equals
    encode(batch_examples(...)) of the same step, over more steps than the shard has examples."""
    from seedflood.core.config import runconfig as config
    from seedflood.ml.workload import Workload

    debug = Path(__file__).resolve().parents[3] / "launch" / "configs" / "debug.yaml"
    w = Workload.build(config.load(debug, [f"run.out_dir={tmp_path}", "task.train_examples=64"]))
    for client in (0, 3):
        for step in range(40):
            want = encoding.encode(
                sampling.batch_examples(w.shard(client), w.seed, client, step, w.task.batch_size),
                w.spec,
                w.loaded.tokenizer,
                w.task.max_tokens,
            )
            assert _same_batch(w.batch(client, step), want), (client, step)
