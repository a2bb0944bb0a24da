"""Experiments built on the roles: the gossip/DiLoCo/MeZO baselines and their wire formats,
`compare` and `sweep`.

May import: core, comm, ml, rundir, roles. Never: bench.
"""
