"""Prompt/verbalizer study: zero-shot dev and test scores of a config's model for several prompts.

Prints one JSON line per (template, candidates) and the one with the best dev AUC (the choice
docs/results.md records; test is only reported, never used to choose). Loads the model once and
swaps the task spec, so ten prompts cost ten evaluations of dev + test.

    python -m seedflood.bench.prompts launch/configs/demo.yaml [section.field=value ...]
"""

from __future__ import annotations

import dataclasses
import json
import sys

from seedflood.core.config import runconfig as config
from seedflood.ml import tasks, workload

PROMPTS = [
    ("{sentence} It was", [" terrible", " great"]),  # MeZO's SST-2 prompt (the rt default)
    ("{sentence} It was", [" bad", " good"]),
    ("{sentence} Overall, the movie was", [" bad", " good"]),
    ("Review: {sentence}\nSentiment:", [" negative", " positive"]),
    ("Review: {sentence}\nIs this review positive or negative? Answer:", [" negative", " positive"]),
    ("Movie review: {sentence}\nThe reviewer's opinion of the movie is", [" negative", " positive"]),
    ("{sentence}\nQuestion: Did the critic like the movie? Answer:", [" No", " Yes"]),
    ('Review: "{sentence}"\nThis review is', [" negative", " positive"]),
    ("{sentence} In short, the film is", [" terrible", " great"]),
    ("Critic: {sentence}\nVerdict:", [" rotten", " fresh"]),
]


def main(argv: list[str]) -> None:
    cfg = config.load(argv[0], argv[1:])
    w = workload.Workload.build(cfg)
    rows = []
    for template, candidates in PROMPTS:
        task = dataclasses.replace(cfg.task, template=template, candidates=candidates)
        w.spec, w.task = tasks.get(task), task
        dev = w.evaluate("dev")
        test = w.evaluate("test", dev=dev)["metrics"]
        row = {
            "template": template,
            "candidates": candidates,
            "dev_auc": dev["metrics"]["auc"],
            "dev_acc": dev["metrics"]["accuracy"],
            "test_auc": test["auc"],
            "test_acc": test["accuracy"],
            "test_thr_acc": test["threshold_accuracy"],
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    print("best by dev AUC:", json.dumps(max(rows, key=lambda r: r["dev_auc"])))


if __name__ == "__main__":
    main(sys.argv[1:] or ["launch/configs/demo.yaml"])
