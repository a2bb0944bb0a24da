"""The model side: loading models, tasks and their data, prompts, scoring, the workload a client
runs, the batched simulation engine, and LoRA injection.

May import: seedflood.core, transformers, datasets. Never: comm, rundir, roles, experiments, bench.
"""
