"""Save a model seedflood can load as a plain Hugging Face directory (the README's worked example).

    python examples/own-data/save_model.py smollm2-135m my-model   # SmolLM2, offline (540 MB)
    python examples/own-data/save_model.py tiny my-model           # the tiny random test model

Any directory written by `save_pretrained` (config.json, weights, tokenizer files) works as
`model.name: PATH`; this script only makes one without a download. The first argument is any
`model.name` seedflood accepts (a hub id needs the network or the HF cache).
"""

from __future__ import annotations

import sys

from seedflood.core.config.trainsections import ModelConfig
from seedflood.ml import model


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[0], "\nusage: save_model.py MODEL_NAME OUT_DIR", file=sys.stderr)
        return 2
    name, out = argv
    loaded = model.load(ModelConfig(name=name))
    loaded.model.save_pretrained(out)
    loaded.tokenizer.save_pretrained(out)
    print(f"saved {loaded.identity} to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
