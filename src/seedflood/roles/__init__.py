"""The processes a run is made of, composed from the layers below: the client, the evaluator,
`train` (one process of a launched run, wired once for its mode: `strictwiring` or `churnwiring`
behind `wiring.Wiring`), the in-process simulation and the shared-model simulation.

May import: core, comm, ml, rundir. Never: experiments, bench.
"""
