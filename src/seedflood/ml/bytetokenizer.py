"""ByteTokenizer: the tiny model's byte-level tokenizer, on the tokenizers library alone.

Owns `ByteTokenizer`: ids 0..3 = <pad> <s> </s> <unk>, 4..259 = the 256 bytes (in the order of
their byte-level BPE characters); prompts get <s> in front. It offers the part of transformers'
tokenizer API this project calls (`__call__` on a string or a list with add_special_tokens and
return_offsets_mapping, `decode`, the special tokens and their ids, `padding_side`, `is_fast`,
`save_pretrained`), and the directory it saves loads in transformers as a fast tokenizer with
the same ids and offsets.

Why: transformers' tokenizer classes cost about 0.7 s of CPU to import per process; the
tokenizers library (which does the work in both cases) costs next to nothing.

Assumes: the `tokenizers` package (a dependency of transformers).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

SPECIALS = ("<pad>", "<s>", "</s>", "<unk>")  # ids 0..3


class ByteTokenizer:
    """Byte-level tokenizer with <s> prepended; see the module docstring."""

    is_fast = True
    pad_token, bos_token, eos_token, unk_token = SPECIALS
    pad_token_id, bos_token_id, eos_token_id, unk_token_id = range(4)

    def __init__(self) -> None:
        vocab = {t: i for i, t in enumerate([*SPECIALS, *sorted(pre_tokenizers.ByteLevel.alphabet())])}
        tk = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=self.unk_token))
        tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        tk.decoder = decoders.ByteLevel()
        tk.post_processor = processors.TemplateProcessing(
            single=f"{self.bos_token} $A", special_tokens=[(self.bos_token, self.bos_token_id)]
        )
        tk.add_special_tokens(list(SPECIALS))  # as transformers registers them: decode can skip them
        self._tk = tk
        self.padding_side = "right"

    def __len__(self) -> int:
        return self._tk.get_vocab_size()

    def __call__(
        self, text: str | list[str], add_special_tokens: bool = True, return_offsets_mapping: bool = False
    ) -> dict[str, Any]:
        """{"input_ids": ids, "attention_mask": ones[, "offset_mapping": (start, end) characters
        of each token]} for one text, or lists of those for a list of texts."""
        single = isinstance(text, str)
        encodings = self._tk.encode_batch([text] if single else list(text), add_special_tokens=add_special_tokens)
        out: dict[str, Any] = {
            "input_ids": [e.ids for e in encodings],
            "attention_mask": [e.attention_mask for e in encodings],
        }
        if return_offsets_mapping:
            out["offset_mapping"] = [e.offsets for e in encodings]
        return {k: v[0] for k, v in out.items()} if single else out

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        return self._tk.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)  # ints, tensors

    def save_pretrained(self, path: str | Path) -> None:
        """tokenizer.json and tokenizer_config.json, as transformers' fast tokenizer saves them."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        self._tk.save(str(path / "tokenizer.json"))
        config = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
            "pad_token": self.pad_token,
            "unk_token": self.unk_token,
            "padding_side": self.padding_side,
        }
        (path / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
