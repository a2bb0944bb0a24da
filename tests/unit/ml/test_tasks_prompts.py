"""MeZO's prompts and verbalizers on fixture rows, COPA's per-example candidates, the hub fallback.

Every expected string below is written by hand from MeZO's templates.py (the table in
/work/shared/REFERENCE.md), never produced by the code under test. Rows go through the real path:
a data file in the hub's column layout -> load_splits -> encode (byte-level tiny tokenizer, so
decoding the ids gives the text back exactly).
"""

from __future__ import annotations

import dataclasses
import json
import os

import pytest
import torch

from seedflood.core.config.trainsections import ModelConfig, TaskConfig
from seedflood.ml import datafiles, encoding, objective, sampling, sources, tasks
from seedflood.ml import model as M

# (task, one row in the hub's columns, the verbalized text of every candidate in label order)
FIXTURES = [
    (
        "sst2",
        {"sentence": "a gripping , funny film ", "label": 1},
        ["a gripping , funny film It was terrible", "a gripping , funny film It was great"],
    ),
    (
        "rte",
        {"sentence1": "The cat sat on the mat.", "sentence2": "A cat is sitting.", "label": "entailment"},
        [
            'The cat sat on the mat.\nDoes this mean that "A cat is sitting." is true? Yes or No?\nYes',
            'The cat sat on the mat.\nDoes this mean that "A cat is sitting." is true? Yes or No?\nNo',
        ],
    ),
    (
        "cb",
        {"premise": "It rained all day.", "hypothesis": "the ground is wet", "label": "neutral"},
        [
            'Suppose It rained all day. Can we infer that "the ground is wet"? Yes, No, or Maybe?\nYes',
            'Suppose It rained all day. Can we infer that "the ground is wet"? Yes, No, or Maybe?\nNo',
            'Suppose It rained all day. Can we infer that "the ground is wet"? Yes, No, or Maybe?\nMaybe',
        ],
    ),
    (
        "boolq",
        {"passage": "Water boils at 100 C at sea level.", "question": "does water boil at 100 c", "label": True},
        [
            "Water boils at 100 C at sea level. Does water boil at 100 c?\nNo",
            "Water boils at 100 C at sea level. Does water boil at 100 c?\nYes",
        ],
    ),
    (
        "wic",
        {"word": "bank", "sentence1": "He sat on the bank.", "sentence2": "She robbed a bank.", "label": 0},
        [
            'Does the word "bank" have the same meaning in these two sentences? Yes, No?\n'
            "He sat on the bank.\nShe robbed a bank.\nNo",
            'Does the word "bank" have the same meaning in these two sentences? Yes, No?\n'
            "He sat on the bank.\nShe robbed a bank.\nYes",
        ],
    ),
    (
        "multirc",
        {
            "paragraph": "Tom has two cats.",
            "question": "How many cats does Tom have?",
            "answer": "Two",
            "idx": {"paragraph": 0, "question": 0, "answer": 0},
            "label": 1,
        },
        [
            'Tom has two cats.\nQuestion: How many cats does Tom have?\nI found this answer "Two". Is that correct? '
            "Yes or No?\nNo",
            'Tom has two cats.\nQuestion: How many cats does Tom have?\nI found this answer "Two". Is that correct? '
            "Yes or No?\nYes",
        ],
    ),
    (
        "copa",
        {
            "premise": "The man broke his toe.",
            "choice1": "He dropped a hammer on his foot.",
            "choice2": "I had kicked the wall.",
            "question": "cause",
            "label": 0,
        },
        [
            "The man broke his toe because he dropped a hammer on his foot.",
            "The man broke his toe because I had kicked the wall.",
        ],
    ),
    (
        "copa",
        {
            "premise": "My body cast a shadow over the grass",
            "choice1": "TV news said so.",
            "choice2": "I'm told the GRASS was cut.",
            "question": "effect",
            "label": 1,
        },  # no final period to drop; MeZO lower-cases the whole first word ("TV", and "I'm", which is not "I")
        [
            "My body cast a shadow over the grass so tv news said so.",
            "My body cast a shadow over the grass so i'm told the GRASS was cut.",
        ],
    ),
]


@pytest.fixture(scope="module")
def tok():
    return sources.tiny_tokenizer()


def load_row(tmp_path, name: str, row: dict) -> datafiles.Example:
    path = tmp_path / f"{name}.jsonl"
    path.write_text(json.dumps(row) + "\n")
    cfg = TaskConfig(name=name, data_files={"train": str(path), "test": str(path)}, dev_examples=0)
    (example,) = sampling.load_splits(cfg, 0).test
    return example


@pytest.mark.parametrize(("name", "row", "want"), FIXTURES, ids=[f"{f[0]}-{i}" for i, f in enumerate(FIXTURES)])
def test_rendered_prompts_are_mezos(tmp_path, tok, name, row, want):
    example = load_row(tmp_path, name, row)
    spec = tasks.get(name)
    batch = encoding.encode([example], spec, tok, 512)
    ids, mask, _ = batch.expand()
    named = {"entailment": 0, "not_entailment": 1, "neutral": 2}  # the hub's label names, by hand
    assert batch.n_candidates == len(want) and example.label == named.get(row["label"], row["label"])
    got = [tok.decode(ids[c][mask[c].bool()], skip_special_tokens=True) for c in range(len(want))]
    assert got == want
    prompt = tok.decode(batch.input_ids[0, : int(batch.lengths[0])], skip_special_tokens=True)
    assert all(w.startswith(prompt) and len(w) > len(prompt) for w in want)  # candidate = the continuation


def test_copa_encodes_per_example_candidates(tok):
    rows = [
        datafiles.Example(
            {"premise": "It got dark.", "choice1": "The sun set.", "choice2": "I slept.", "question": "cause"}, 0
        ),
        datafiles.Example(
            {"premise": "She was thirsty", "choice1": "She drank water.", "choice2": "A b.", "question": "effect"}, 1
        ),
    ]
    spec = tasks.get("copa")
    batch = encoding.encode(rows, spec, tok, 64)
    assert batch.per_example and batch.n_candidates == 2 and batch.option_ids.shape[0] == 4
    opts, mask = batch.row_options()
    assert opts.shape == mask.shape == batch.option_ids.shape  # (B·C)×L: already one row per scored sequence
    got = [tok.decode(opts[r][mask[r]]) for r in range(4)]
    assert got == [" the sun set.", " I slept.", " she drank water.", " a b."]
    ids, attn, _ = batch.expand()
    assert [tok.decode(ids[r][attn[r].bool()], skip_special_tokens=True) for r in range(4)] == [
        "It got dark because the sun set.",
        "It got dark because I slept.",
        "She was thirsty so she drank water.",
        "She was thirsty so a b.",
    ]
    bare = encoding.encode(rows, dataclasses.replace(spec, choices=lambda f: (f["choice1"], f["choice2"])), tok, 64)
    first = [[tok(c[:1], add_special_tokens=False)["input_ids"][0] for c in pair] for pair in (("T", "I"), ("S", "A"))]
    assert bare.first_tokens().tolist() == first  # each example's own first option tokens, B×C
    assert not batch.single_token and batch.labels.tolist() == [0, 1]
    moved = batch.to("cpu")
    assert moved.per_example and moved.n_candidates == 2


def test_fixed_candidates_keep_the_shared_table(tok):
    rows = [datafiles.Example({"sentence": s}, 1) for s in ("good", "a bad one")]
    batch = encoding.encode(rows, tasks.get("sst2"), tok, 64)
    assert not batch.per_example and batch.option_ids.shape[0] == 2 and batch.n_candidates == 2
    opts, mask = batch.row_options()
    assert opts.equal(batch.option_ids.repeat(2, 1)) and mask.equal(batch.option_mask.repeat(2, 1))
    assert batch.first_tokens().equal(batch.option_ids[:, 0].expand(2, 2))


def test_copa_rejects_an_unknown_question(tmp_path):
    row = {"premise": "p.", "choice1": "a", "choice2": "b", "question": "why", "label": 0}
    with pytest.raises(datafiles.TaskError, match=r"copa.jsonl: question 'why' is not cause or effect$"):
        load_row(tmp_path, "copa", row)


@pytest.mark.skipif(os.environ.get("HF_HUB_OFFLINE") != "1", reason="needs HF_HUB_OFFLINE=1 (no network)")
@pytest.mark.parametrize(
    ("name", "columns"),
    [
        ("cb", "premise, hypothesis, label"),
        ("wic", "word, sentence1, sentence2, label"),
        ("multirc", "paragraph, question, answer, label"),
        ("copa", "premise, choice1, choice2, question, label"),
    ],
)
def test_missing_dataset_is_one_line_saying_how_to_provide_files(name, columns):
    with pytest.raises(datafiles.TaskError) as info:
        sampling.load_splits(TaskConfig(name=name), 0)
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"task {name}: no task.data_files and hub dataset aps/super_glue")
    assert message.endswith(
        f"set task.data_files: {{train: FILE, test: FILE}} (csv/tsv/json/jsonl/parquet with columns {columns})"
    )


def naive_copa_scores(model, tok, rows) -> torch.Tensor:
    """One unpadded sequence per (example, candidate): mean log-prob of the candidate's bytes."""
    spec = tasks.get("copa")
    out = torch.zeros(len(rows), 2)
    for i, e in enumerate(rows):
        p = tok(spec.template(e.fields))["input_ids"]
        for c, cand in enumerate(spec.choices(e.fields)):
            opt = tok(cand, add_special_tokens=False)["input_ids"]
            with torch.no_grad():
                logp = model(input_ids=torch.tensor([p + opt])).logits[0].log_softmax(-1)
            out[i, c] = torch.stack([logp[len(p) - 1 + j, t] for j, t in enumerate(opt)]).mean()
    return out


def test_copa_scores_match_a_naive_reference():
    tiny = M.load(ModelConfig(name="tiny"))
    rows = [
        datafiles.Example(
            {"premise": "It got dark.", "choice1": "The sun set.", "choice2": "I slept.", "question": "cause"}, 0
        ),
        datafiles.Example(
            {"premise": "Rain fell", "choice1": "The road got wet.", "choice2": "Dogs barked.", "question": "effect"}, 0
        ),
        datafiles.Example(
            {"premise": "He ran.", "choice1": "He was late.", "choice2": "He was very tired.", "question": "cause"}, 1
        ),
    ]
    scores = objective.candidate_scores(tiny.model, encoding.encode(rows, tasks.get("copa"), tiny.tokenizer, 64))
    torch.testing.assert_close(scores, naive_copa_scores(tiny.model, tiny.tokenizer, rows), atol=1e-5, rtol=0)
