"""The pure core: what every process agrees on, and nothing of the outside world.

Owns seeds (rng), directions and SubCGE, the ZO estimate (zo), messages and their wire codec,
flooding, membership notes, the agreement on committed steps, the protocol value, replay, the
topology, the config schema, and the transport interface with its byte counter.

May import: the standard library, numpy, torch (tensors only), networkx, pyyaml, pydantic.
Never: torch.distributed, transformers, datasets, the environment, or any other seedflood package
(the contracts in pyproject.toml's [tool.importlinter] enforce this in `make lint`).
"""
