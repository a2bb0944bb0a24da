"""A run directory on disk: its paths (layout.RunDir), the message log, checkpoints, metrics, resume
decisions, the clients' own logs and the run's summary.

May import: seedflood.core. Never: comm, ml, roles, experiments, bench.
"""
