"""Prompts and verbalizers: MeZO's templates (Malladi et al., 2023, its appendix and its
`templates.py`) and the user-written template of the generic `table` task.

Owns: example fields -> prompt text, and the candidate strings (in label order) appended to it.
A candidate carries its own leading separator (" great" after "... It was", "Yes" after a
newline), so prompt + candidate is exactly MeZO's verbalized text and the candidate's tokens,
tokenized on their own, are the tokens a byte-level BPE gives the joined text (tasks.encode).

Assumes: fields are already stripped strings (tasks._rows strips them, as MeZO strips SST-2's
sentence). Pure Python: no torch, no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

Template = Callable[[Mapping[str, str]], str]
Choices = Callable[[Mapping[str, str]], tuple[str, ...]]


class PromptError(ValueError):
    """An example a template cannot render (one line naming the field)."""


def sst2(f: Mapping[str, str]) -> str:
    """SST-2 (and rt): `<sentence> It was` + " terrible" / " great"."""
    return f"{f['sentence']} It was"


def rte(f: Mapping[str, str]) -> str:
    """RTE: Yes (entailment) / No."""
    return f'{f["premise"]}\nDoes this mean that "{f["hypothesis"]}" is true? Yes or No?\n'


def cb(f: Mapping[str, str]) -> str:
    """CB: Yes (entailment) / No (contradiction) / Maybe (neutral)."""
    return f'Suppose {f["premise"]} Can we infer that "{f["hypothesis"]}"? Yes, No, or Maybe?\n'


def boolq(f: Mapping[str, str]) -> str:
    """BoolQ: the question gets a final "?" and a capital first letter; No (False) / Yes (True)."""
    q = f["question"].strip()
    q = q if q.endswith("?") else q + "?"
    return f"{f['passage']} {q[:1].upper() + q[1:]}\n"


def wic(f: Mapping[str, str]) -> str:
    """WiC: No (different meaning) / Yes."""
    return (
        f'Does the word "{f["word"]}" have the same meaning in these two sentences? Yes, No?\n'
        f"{f['sentence1']}\n{f['sentence2']}\n"
    )


def multirc(f: Mapping[str, str]) -> str:
    """MultiRC: one (paragraph, question, answer) per example; No (wrong answer) / Yes."""
    return (
        f"{f['paragraph']}\nQuestion: {f['question']}\n"
        f'I found this answer "{f["answer"]}". Is that correct? Yes or No?\n'
    )


COPA_CONJUNCTIONS = {"effect": " so", "cause": " because"}
"""MeZO's " so " / " because " without the trailing space: the candidate carries it."""


def copa(f: Mapping[str, str]) -> str:
    """COPA: the premise without its final period, then " so" (effect) or " because" (cause)."""
    premise = f["premise"].rstrip()
    if premise.endswith("."):
        premise = premise[:-1]
    question = f["question"]
    if question not in COPA_CONJUNCTIONS:
        raise PromptError(f"COPA question must be cause or effect, got {question!r}")
    return premise + COPA_CONJUNCTIONS[question]


def copa_choice(choice: str) -> str:
    """MeZO's "correct" capitalization: the first word lower-cased unless it is "I"."""
    words = choice.split(" ")
    if words[0] != "I":
        words[0] = words[0].lower()
    return " ".join(words)


def copa_choices(f: Mapping[str, str]) -> tuple[str, ...]:
    """COPA's per-example candidates (label 0 = choice1), each scored as the continuation."""
    return (" " + copa_choice(f["choice1"]), " " + copa_choice(f["choice2"]))


def synthetic(f: Mapping[str, str]) -> str:
    return f"{f['sentence']}\n"


def formatted(template: str) -> Template:
    """A user template ("{text} It was") as a Template: slots filled with the example's fields."""

    def render(f: Mapping[str, str]) -> str:
        try:
            return template.format_map(f)
        except KeyError as e:
            raise PromptError(f"template {template!r} names {e.args[0]!r}, not a field of this task") from None

    return render
