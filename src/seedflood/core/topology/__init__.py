"""The client graph: the value, its builders and files, and a run's topology from its config (the rank map)."""
