"""A run directory on disk: the message log, checkpoints, metrics, resume decisions, client logs.

May import: seedflood.core. Never: comm, ml, roles, experiments, bench.
"""
