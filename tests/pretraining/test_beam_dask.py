"""`kbert create-data --runner DaskRunner`: the Beam pipeline on a second real engine.

A Dask cluster on this machine (a scheduler and two worker processes on 127.0.0.1) runs the
job through Beam's DaskRunner; the records must be the local path's, and the statistics the
DirectRunner's. Dask's runner has no metrics and evaluates a singleton side input once per
consumer, so this also checks that the pipeline needs neither.
"""

import json

import pytest

from conftest import run_kbert
from test_beam_pipeline import STATISTICS, corpus, create, local_run, records  # noqa: F401 (fixtures)

pytest.importorskip("apache_beam")
distributed = pytest.importorskip("distributed")
pytestmark = pytest.mark.slow

# What depends on the machine and the moment, not on the records.
RUN_ONLY = {
    "output_files",
    "runner",
    "seconds",
    "instances_per_second",
    "peak_rss_mib_largest_worker",
    "peak_rss_mib_main",
}


@pytest.fixture(scope="module")
def dask_cluster():
    """A scheduler and two single-threaded worker processes, on 127.0.0.1 (no dashboard)."""
    with distributed.LocalCluster(
        n_workers=2, processes=True, threads_per_worker=1, host="127.0.0.1", dashboard_address=None
    ) as cluster:
        yield cluster


def test_dask_runner_writes_the_local_records_and_the_direct_runners_statistics(
    corpus, local_run, dask_cluster, tmp_path
):
    _, files = corpus
    options = f"--dask_client_address={dask_cluster.scheduler_address}"
    dask = create(
        ["--runner", "DaskRunner", "--pipeline-options", options, "--shards", "2"], files, tmp_path / "dask.tfrecord"
    )
    direct = create(["--runner", "DirectRunner", "--shards", "2"], files, tmp_path / "direct.tfrecord")
    assert dask["runner"] == "DaskRunner" and len(dask["output_files"]) == 2
    assert records(dask["output_files"]) == records(local_run["output_files"])
    assert len(records(dask["output_files"])) == local_run["instances"] > 50
    for key in STATISTICS:
        assert dask[key] == pytest.approx(local_run[key], rel=1e-9), key
    assert {k: v for k, v in dask.items() if k not in RUN_ONLY} == {
        k: v for k, v in direct.items() if k not in RUN_ONLY
    }
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [f"{name}.tfrecord-0000{i}-of-00002" for name in ("dask", "direct") for i in range(2)]
    )
    # Both worker processes ran tasks: the job was spread, not run by one of them (or by this one).
    with distributed.Client(dask_cluster) as client:
        executed = client.run(lambda dask_worker: dask_worker.state.executed_count)
    assert len(executed) == 2 and all(n > 0 for n in executed.values()), executed


def test_dask_runner_counts_the_local_vocab(corpus, dask_cluster, tmp_path):
    _, files = corpus
    results = {}
    for name, args in (
        ("local", []),
        (
            "dask",
            ["--runner", "DaskRunner", "--pipeline-options", f"--dask_client_address={dask_cluster.scheduler_address}"],
        ),
    ):
        out = tmp_path / f"{name}.txt"
        results[name] = json.loads(
            run_kbert("vocab", "--input", *files, "--output", out, "--size", "300", *args).stdout
        )
        results[name]["lines"] = out.read_text(encoding="utf-8")
    for key in ("lines", "size", "words", "distinct_words", "unk_rate"):
        assert results["dask"][key] == results["local"][key], key
