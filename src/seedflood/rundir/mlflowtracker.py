"""The MLflow tracker (eval.trackers: mlflow), through mlflow's own client (`pip install 'seedflood[mlflow]'`).

Owns `MlflowRun` and `open_run`: one MLflow run per run directory, in the experiment "seedflood",
named after the run directory; the run's settings as its parameters, each metrics record's
scalars as metrics at their step, the final state hash as the tag `param_hash`.

Where: the tracking server or store MLFLOW_TRACKING_URI names, else a file store in
`<run dir>/trackers/mlruns` (`mlflow ui --backend-store-uri <that folder>`). MLflow 3 keeps the
file store in maintenance mode behind MLFLOW_ALLOW_FILE_STORE, which this sets for that store
only when unset: mlflow-skinny (the light package) has no database store, and a local folder
needs no server.

Assumes: mlflow-skinny >= 3 (or mlflow); `mlflow` is imported only here, when a run opens.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from seedflood.rundir.trackers import STORE, read_run_id, write_run_id

NAME = "mlflow"
EXPERIMENT = "seedflood"
BATCH = 100  # params per log_batch call (MLflow's limit)


def store_uri(root: Path) -> str:
    """The tracking URI a run in `root` logs to: MLFLOW_TRACKING_URI, else its file store."""
    return os.environ.get("MLFLOW_TRACKING_URI") or (root / STORE / "mlruns").resolve().as_uri()


class MlflowRun:
    name = NAME

    def __init__(self, client: Any, run_id: str) -> None:
        from mlflow.entities import Metric, RunTag

        self._client, self.run_id = client, run_id
        self._metric, self._tag = Metric, RunTag

    def log(self, step: int, scalars: Mapping[str, float]) -> None:
        ms = int(time.time() * 1000)
        self._client.log_batch(self.run_id, metrics=[self._metric(k, v, ms, step) for k, v in scalars.items()])

    def summary(self, values: Mapping[str, str]) -> None:
        self._client.log_batch(self.run_id, tags=[self._tag(k, v) for k, v in values.items()])

    def close(self) -> None:
        self._client.set_terminated(self.run_id)


def client_of(root: Path) -> Any:
    """mlflow's client over the store a run in `root` logs to (for writing, and reading back)."""
    uri = store_uri(root)
    if uri.startswith("file:"):
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


def open_run(root: Path, settings: Mapping[str, str], resume: bool) -> MlflowRun:
    from mlflow.entities import Param

    client = client_of(root)
    run_id = read_run_id(root, NAME) if resume else None
    if run_id is not None:
        client.update_run(run_id, status="RUNNING")
        return MlflowRun(client, run_id)
    found = client.get_experiment_by_name(EXPERIMENT)
    experiment = found.experiment_id if found is not None else client.create_experiment(EXPERIMENT)
    run = client.create_run(experiment, run_name=root.resolve().name, tags={"seedflood.run_dir": str(root.resolve())})
    params = [Param(k, v) for k, v in sorted(settings.items())]
    for i in range(0, len(params), BATCH):
        client.log_batch(run.info.run_id, params=params[i : i + BATCH])
    write_run_id(root, NAME, run.info.run_id)
    return MlflowRun(client, run.info.run_id)
