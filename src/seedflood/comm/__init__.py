"""Transports: the only package that touches torch.distributed.

Owns the gloo point-to-point transport and its framing, the in-memory transport the simulation
uses, the process-group runtime (store, ranks, ports), bounded waits, edge links with their
rendezvous and heartbeats, and the evaluator's attach channel.

May import: seedflood.core. Never: ml, rundir, roles, experiments, bench.
"""
