"""The body of one of the racing processes of test_sweep_scale (imported by multiprocessing's spawn)."""
import os


def prepare_rounds(workdir, storages, tracking_uri, barrier, results):
    """Round r: at the barrier, create and migrate the fresh MLflow store fresh-r.db; at the barrier again, prepare
    study race-r (what every `atlas-lab sweep` does first: open the storage, then prepare). Puts (round, parent run
    id, enqueued) or an error."""
    os.chdir(workdir)
    from mlflow.tracking import MlflowClient

    from atlas_lab.sweep.driver import open_checked, prepare_study
    from atlas_lab.sweep.spec import load_sweep
    from atlas_lab.sweep.tracking import init_store

    client = MlflowClient(tracking_uri)
    for r, storage in enumerate(storages):
        spec = load_sweep(f"race-{r}.yaml")
        try:
            barrier.wait()
            init_store(f"sqlite:///{workdir}/fresh-{r}.db")
            barrier.wait()
            open_checked(storage)
            _, parent, added, _ = prepare_study(spec, storage, client)
            results.put((r, parent, added))
        except Exception as e:
            results.put((r, "error", f"{type(e).__name__}: {e}"))
