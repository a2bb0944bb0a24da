"""SeedFlood: decentralized zeroth-order fine-tuning by flooding (origin, step, seed, scalar) updates."""

__version__ = "0.1.0"
