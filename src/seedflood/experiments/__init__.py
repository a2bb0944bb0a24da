"""Experiments built on the roles: the gossip/DiLoCo/MeZO baselines and their wire formats,
`compare`, `sweep` and `reproduce` (the paper's grid fitted to a time budget).

May import: core, comm, ml, rundir, roles. Never: bench.
"""
