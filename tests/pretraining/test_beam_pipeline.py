"""`kbert create-data --runner DirectRunner`: the Beam pipeline writes exactly the local path's records.

Beam's own DirectRunner runs it, in memory and in multi_processing mode with two worker
processes; the reference is the local path (itself checked against the original script in
test_create_data.py) and the original code's reader and script. test_beam_dask.py runs it on a
Dask cluster.
"""

import json
import os
import re
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from conftest import UNCASED_VOCAB, assert_user_error, kbert_command, popen_interruptible, run_kbert, sigint_state
from kbert.runtime.errors import KbertError
from test_create_data import (  # noqa: F401 (fixture)
    SAMPLE,
    compute_statistics,
    many_documents_corpus,
    original,
    original_input_fn,
    read_examples,
    write_original,
)

pytest.importorskip("apache_beam")
pytestmark = pytest.mark.slow

MULTI = "--direct_num_workers=2 --direct_running_mode=multi_processing"
STATISTICS = (
    "instances",
    "documents",
    "skipped_empty_documents",
    "mean_length",
    "masked_share",
    "mask_token_share",
    "kept_share",
    "random_share",
    "random_next_share",
    "replaced_invalid_utf8",
)


def records(paths):
    """The records of TFRecord files, as a sorted list of bytes (a multiset)."""
    import tensorflow as tf

    return sorted(r.numpy() for r in tf.data.TFRecordDataset([str(p) for p in paths]))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Real text split over three files, in chunks that span file boundaries."""
    base = tmp_path_factory.mktemp("corpus")
    whole = many_documents_corpus(base / "many.txt", lines_per_document=2).read_text(encoding="utf-8")
    documents = whole.split("\n\n")
    third = len(documents) // 3
    parts = [documents[:third], documents[third : 2 * third], documents[2 * third :]]
    files = []
    for i, part in enumerate(parts):
        files.append(base / f"part-{i}.txt")
        # A bad byte, to check the replaced-UTF-8 count comes through the pipeline too.
        files[-1].write_bytes(("\n\n".join(part) + "\n").encode() + (b"caf\xe9\n" if i == 1 else b""))
    return base, files


@pytest.fixture(scope="module")
def local_run(corpus, tmp_path_factory):
    """The local path's run on the corpus: the records and statistics every runner must give."""
    _, files = corpus
    return create(["--workers", "1"], files, tmp_path_factory.mktemp("local") / "local.tfrecord")


# `create`'s flags, for calling run_pipeline itself.
OPTIONS = dict(max_seq_length=64, max_predictions_per_seq=10, dupe_factor=3)
STALE = "0123456789abcdef" * 2  # a uuid's 32 hex digits, as stale temporary folders end


def fail(self, element):
    raise OSError("disk on fire")


def create(args, corpus_files, out, *extra):
    # Small chunks, so the corpus makes several and they cross file ends.
    flags = ["--dupe-factor", "3", "--max-seq-length", "64", "--max-predictions-per-seq", "10", "--chunk-docs", "3"]
    # Beam's runners start worker processes of their own: the call can run in this process
    # (the local path with --workers 2 spawns, so it gets a process of its own).
    result = run_kbert(
        "create-data",
        "--input",
        *corpus_files,
        "--vocab",
        UNCASED_VOCAB,
        "--output",
        out,
        *flags,
        *args,
        *extra,
        own_process="--runner" not in args,
    )
    return json.loads(result.stdout)


def test_every_runner_worker_and_shard_count_writes_the_same_records(corpus, local_run, tmp_path):
    base, files = corpus
    local = local_run
    assert local["chunks"] > 3
    runs = {
        "local, 2 workers, 2 shards": create(["--workers", "2", "--shards", "2"], files, tmp_path / "l2.tfrecord"),
        "DirectRunner in memory": create(["--runner", "DirectRunner"], files, tmp_path / "d.tfrecord"),
        "DirectRunner, 2 processes, 3 shards": create(
            ["--runner", "DirectRunner", "--pipeline-options", MULTI, "--shards", "3"], files, tmp_path / "mp.tfrecord"
        ),
    }
    want = records(local["output_files"])
    assert len(want) == local["instances"] > 50
    for name, run in runs.items():
        assert records(run["output_files"]) == want, name
        for key in STATISTICS:
            assert run[key] == pytest.approx(local[key], rel=1e-9), (name, key)
    assert local["replaced_invalid_utf8"] == 1
    assert not [p for p in tmp_path.iterdir() if "temp" in p.name]  # Beam's temporary files are gone
    # The seed decides the records, the runner does not.
    other = create(["--runner", "DirectRunner", "--seed", "12346"], files, tmp_path / "seed.tfrecord")
    assert records(other["output_files"]) != want


def test_one_chunk_is_the_original_scripts_records_and_its_reader_parses_them(original, original_input_fn, tmp_path):
    theirs = tmp_path / "original.tfrecord"
    write_original(original, SAMPLE, [theirs], dupe_factor=3, seed=5, max_seq_length=64, max_predictions_per_seq=10)
    ours = create(
        ["--runner", "DirectRunner", "--pipeline-options", MULTI, "--seed", "5"], [SAMPLE], tmp_path / "beam.tfrecord"
    )
    # Parsed, not as bytes: the original's protobuf writer orders the feature map its own way.
    parsed = sorted(json.dumps(e, sort_keys=True) for path in ours["output_files"] for e in read_examples(path))
    assert parsed == sorted(json.dumps(e, sort_keys=True) for e in read_examples(theirs))
    n = ours["instances"]
    batch = next(iter(original_input_fn(ours["output_files"], 64, 10, is_training=False)({"batch_size": n})))
    assert tuple(batch["input_ids"].shape) == (n, 64) and tuple(batch["masked_lm_weights"].shape) == (n, 10)
    want = compute_statistics([theirs], UNCASED_VOCAB)
    for key, value in want.items():
        assert ours[key] == pytest.approx(value, rel=1e-9), key


@pytest.mark.parametrize("stop", [signal.SIGKILL, signal.SIGINT], ids=["kill-9", "ctrl-c"])
def test_a_stopped_job_leaves_nothing_under_the_final_names(tmp_path, stop):
    """kill -9 leaves the staging folder (nothing can remove it), and the next run writing the
    same output removes it; Ctrl-C (to the process group, as a terminal sends it) leaves nothing."""
    big = tmp_path / "big.txt"
    big.write_text((Path(SAMPLE).read_text(encoding="utf-8") + "\n") * 400, encoding="utf-8")
    out = tmp_path / "out" / "data.tfrecord"
    process = popen_interruptible(
        kbert_command()
        + [
            "create-data",
            "--input",
            str(big),
            "--vocab",
            UNCASED_VOCAB,
            "--output",
            str(out),
            "--dupe-factor",
            "10",
            "--runner",
            "DirectRunner",
            "--pipeline-options",
            MULTI,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    # Stop it once the workers have begun writing chunk files (staged beside the output).
    deadline = time.monotonic() + 120
    while not list(tmp_path.glob("out/kbert-temp-*/*")) and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert process.poll() is None, "the job ended before it could be stopped; make the corpus bigger"
    state = sigint_state(process.pid)
    os.killpg(process.pid, stop)
    _, stderr = process.communicate(timeout=120)
    assert not out.exists() and not list(tmp_path.glob("out/data.tfrecord*")), state
    if stop == signal.SIGINT:
        assert process.returncode == 130 and stderr.decode().splitlines() == ["kbert: interrupted"], state
        assert not [p for p in tmp_path.glob("out/*") if "temp" in p.name]
        return
    assert list(tmp_path.glob("out/kbert-temp-*/*"))  # it was writing
    run_kbert(
        "create-data",
        "--input",
        SAMPLE,
        "--vocab",
        UNCASED_VOCAB,
        "--output",
        out,
        "--dupe-factor",
        "1",
        "--runner",
        "DirectRunner",
        own_process=False,
    )
    assert sorted(p.name for p in out.parent.iterdir()) == ["data.tfrecord"]  # the dead run's folder is gone


def test_stale_temporaries_are_swept_and_a_failed_job_leaves_none(corpus, monkeypatch, tmp_path):
    """A run removes what earlier runs on its output left beside it (its own staging folders and
    Beam's file sink's `beam-temp-*`), and no other output's; a job that fails leaves none."""
    from kbert.pretraining import beam_pipeline
    from kbert.pretraining.create_data import DataOptions

    _, files = corpus
    stale = [f"beam-temp-data.tfrecord-{STALE}", f"kbert-temp-data.tfrecord-{STALE}"]
    others = [f"beam-temp-data.tfrecord2-{STALE}", f"kbert-temp-other.tfrecord-{STALE}", "beam-temp-data.tfrecord-x"]
    for name in stale + others:
        (tmp_path / name).mkdir()
        (tmp_path / name / "part").write_bytes(b"left by a killed run")
    options = DataOptions(**OPTIONS)
    beam_pipeline.run_pipeline(files, UNCASED_VOCAB, tmp_path / "data.tfrecord", options=options, chunk_docs=3)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["data.tfrecord", *others])

    monkeypatch.setattr(beam_pipeline.WriteShard, "process", fail)
    with pytest.raises(KbertError, match="the DirectRunner job failed: .*disk on fire"):
        beam_pipeline.run_pipeline(
            files, UNCASED_VOCAB, tmp_path / "failed.tfrecord", options=options, chunk_docs=3, shards=2
        )
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["data.tfrecord", *others])
    # Workers that wrote where the launcher does not look (a cluster without the output's disk).
    monkeypatch.undo()
    monkeypatch.setattr(beam_pipeline, "_write_statistics", lambda totals, staging: None)
    # Called from Python, the message names the argument (`output`), not the command's --output.
    with pytest.raises(KbertError, match="ended without its results .* give an output on a file system both reach"):
        beam_pipeline.run_pipeline(files, UNCASED_VOCAB, tmp_path / "unseen.tfrecord", options=options, chunk_docs=3)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["data.tfrecord", *others])


def test_inputs_are_named_as_on_the_local_path(corpus, local_run, tmp_path):
    """A quoted glob, comma-separated globs, a directory: Beam takes --input as the local path
    does (kbert.runtime.files.expand_inputs), called as a library too (where no CLI expands them)."""
    from kbert.pretraining.beam_pipeline import run_pipeline
    from kbert.pretraining.create_data import DataOptions
    from kbert.text.vocab_builder import count_words
    from kbert.text.vocab_pipeline import beam_word_counts

    base, files = corpus
    want = records(local_run["output_files"])
    for name, patterns in (("glob", [str(base / "part-*.txt")]), ("commas", [f"{files[0]},{base}/part-[12].txt"])):
        result = run_pipeline(
            patterns, UNCASED_VOCAB, tmp_path / f"{name}.tfrecord", options=DataOptions(**OPTIONS), chunk_docs=3
        )
        assert records(result["output_files"]) == want, name
        assert beam_word_counts(patterns, tmp_path / "vocab.txt") == count_words(files), name
    with pytest.raises(KbertError, match=f"^{re.escape(str(base))}: is a directory"):
        run_pipeline([str(base)], UNCASED_VOCAB, tmp_path / "never.tfrecord")
    with pytest.raises(KbertError, match=f"^{re.escape(str(base))}: is a directory"):
        beam_word_counts([f"{files[0]},{base}"])
    for command in (["create-data", "--vocab", UNCASED_VOCAB], ["vocab"]):
        for runner in ("DirectRunner", "local"):
            out = tmp_path / "never"
            result = run_kbert(
                *command, "--input", base, "--output", out, "--runner", runner, check=False, own_process=False
            )
            assert_user_error(result, f"{base}: is a directory", alone=False)
            assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["commas.tfrecord", "glob.tfrecord"]


def test_beam_log_shows_only_with_debug(tmp_path):
    args = [
        "create-data",
        "--input",
        SAMPLE,
        "--vocab",
        UNCASED_VOCAB,
        "--dupe-factor",
        "2",
        "--runner",
        "DirectRunner",
        "--pipeline-options",
        MULTI,
    ]
    quiet = run_kbert(*args, "--output", tmp_path / "quiet.tfrecord", own_process=True)
    assert json.loads(quiet.stdout)["instances"] == 23
    assert quiet.stderr == ""  # Beam's and its worker processes' some 45 INFO and WARNING lines: gone
    debug = run_kbert("--debug", *args, "--output", tmp_path / "debug.tfrecord", own_process=True)
    assert "INFO:apache_beam.runners.worker.sdk_worker:" in debug.stderr  # asked for: all of it


def test_memory_does_not_grow_with_the_corpus(tmp_path):
    """The shuffle carries one path per chunk, so no process holds more than a chunk's records:
    four times the corpus, the same peak memory. (One element per record, the runner's own
    process grew by about 5 KB a record: some 200 MB more for the larger corpus here.)"""
    text = (Path(SAMPLE).read_text(encoding="utf-8") + "\n") * 100  # ~440 kB, 14 chunks of 20 documents
    peaks = {}
    for times in (1, 4):
        corpus = tmp_path / f"corpus{times}.txt"
        corpus.write_text(text * times, encoding="utf-8")
        # A process of its own: this one's peak is whatever earlier tests left.
        result = run_kbert(
            "create-data",
            "--input",
            corpus,
            "--vocab",
            UNCASED_VOCAB,
            "--output",
            tmp_path / f"out{times}.tfrecord",
            "--max-seq-length",
            "64",
            "--max-predictions-per-seq",
            "10",
            "--chunk-docs",
            "20",
            "--dupe-factor",
            "5",
            "--shards",
            "4",
            "--runner",
            "DirectRunner",
            "--pipeline-options",
            MULTI,
            own_process=True,
        )
        peaks[times] = json.loads(result.stdout)
    assert peaks[4]["instances"] > 3.5 * peaks[1]["instances"] > 10_000
    for key in ("peak_rss_mib_main", "peak_rss_mib_largest_worker"):
        assert peaks[4][key] < peaks[1][key] + 40, (key, peaks[1][key], peaks[4][key])


def test_bad_input_one_line_and_nothing_written(corpus, tmp_path):
    _, files = corpus
    out = tmp_path / "out.tfrecord"

    def fails(*args, fragment, runner="DirectRunner"):
        result = run_kbert(
            "create-data",
            "--vocab",
            UNCASED_VOCAB,
            "--output",
            out,
            "--runner",
            runner,
            *args,
            check=False,
            own_process=False,
        )  # each fails before any worker starts
        assert_user_error(result, fragment, alone=False)
        assert not out.exists()

    fails("--input", str(tmp_path / "nothing-*.txt"), fragment="no file matches")
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n\n")
    fails("--input", empty, fragment="no text")
    binary = tmp_path / "random.bin"
    binary.write_bytes(os.urandom(20_000))
    for runner in ("DirectRunner", "local"):
        fails("--input", binary, fragment="random.bin: not UTF-8 text", runner=runner)
    # Remote paths reach Beam's file systems as written (not folded to s3:/bucket by a path type).
    fails("--input", "s3://kbert-test-bucket/corpus.txt", fragment="s3://kbert-test-bucket/corpus.txt: cannot list it")
    result = run_kbert(
        "create-data",
        "--vocab",
        UNCASED_VOCAB,
        "--input",
        files[0],
        "--output",
        "gs://kbert-test-bucket/data.tfrecord",
        "--runner",
        "DirectRunner",
        check=False,
        own_process=False,
    )
    assert_user_error(result, "--output gs://kbert-test-bucket/data.tfrecord", "apache-beam[gcp]", alone=False)
    fails("--input", files[0], fragment="--runner", runner="SparkRunnr")
    fails("--input", files[0], "--pipeline-options", "--direct_num_wrkers=2", fragment="--direct_num_wrkers")
    fails("--input", files[0], "--pipeline-options", "--direct_running_mode=fast", fragment="Beam refuses")
    fails("--input", files[0], "--pipeline-options", "--direct_num_workers=2", fragment="--runner", runner="local")


def test_vocab_counted_by_beam_is_the_local_vocab(corpus, tmp_path):
    _, files = corpus
    results = {}
    for name, args in (("local", []), ("beam", ["--runner", "DirectRunner", "--pipeline-options", MULTI])):
        out = tmp_path / f"{name}.txt"
        results[name] = json.loads(
            run_kbert("vocab", "--input", *files, "--output", out, "--size", "300", *args).stdout
        )
        results[name]["lines"] = out.read_text(encoding="utf-8")
    assert results["beam"]["lines"] == results["local"]["lines"]
    for key in ("size", "words", "distinct_words", "unk_rate"):
        assert results["beam"][key] == results["local"][key], key
    assert not [p for p in tmp_path.iterdir() if ".counts-" in p.name]  # nothing beside the output
    # A binary file is refused by name on both paths, before anything is learnt or written.
    binary = tmp_path / "random.bin"
    binary.write_bytes(os.urandom(20_000))
    for args in ([], ["--runner", "DirectRunner"]):
        out = tmp_path / "never.txt"
        result = run_kbert("vocab", "--input", files[0], binary, "--output", out, *args, check=False, own_process=False)
        assert_user_error(result, "random.bin: not UTF-8 text", alone=False)
        assert not out.exists()
    # The rate from word counts is the rate of tokenizing the text (a small vocabulary, so some [UNK]).
    from kbert.text import vocab_builder

    tiny = tmp_path / "half-the-letters.txt"
    letters = "abcdefghijklm"
    tiny.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *letters, *("##" + c for c in letters)]))
    rate = vocab_builder.unk_rate(files, tiny)
    assert vocab_builder.unk_rate_of_counts(vocab_builder.count_words(files), tiny) == pytest.approx(rate, rel=1e-12)
    assert 0.1 < rate < 1


def test_vocab_counts_stay_in_the_temp_location(corpus, monkeypatch, tmp_path):
    """A relative --output works, and the counts go to a fresh temporary folder (or under Beam's
    --temp_location), never beside the output; gone afterwards, after a failed job too."""
    from kbert.text import vocab_pipeline
    from kbert.text.vocab_builder import count_words

    _, files = corpus
    want = count_words(files)
    work, system_temp, beam_temp = tmp_path / "work", tmp_path / "system-temp", tmp_path / "work" / "beam-temp"
    for folder in (work, system_temp, beam_temp):
        folder.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setattr(tempfile, "tempdir", str(system_temp))  # where mkdtemp makes the fresh folder
    for output, flags in (
        ("vocab.txt", ""),
        (os.path.join("out", "vocab.txt"), "--direct_num_workers=2"),
        ("temp.txt", "--temp_location=beam-temp"),
    ):  # relative, for the workers too
        result = run_kbert(
            "vocab",
            "--input",
            *files,
            "--output",
            output,
            "--size",
            "300",
            "--runner",
            "DirectRunner",
            "--pipeline-options",
            flags,
            own_process=False,
        )
        assert json.loads(result.stdout)["distinct_words"] == len(want), output
    assert sorted(str(p.relative_to(work)) for p in work.rglob("*")) == [
        "beam-temp",
        "out",
        os.path.join("out", "vocab.txt"),
        "temp.txt",
        "vocab.txt",
    ]
    assert not [p for p in system_temp.iterdir() if "kbert" in p.name]  # (Beam keeps caches of its own there)

    monkeypatch.setattr(vocab_pipeline._Words, "process", fail)
    for flags in ("", "--temp_location=beam-temp"):
        with pytest.raises(KbertError, match="the DirectRunner job failed: .*disk on fire"):
            vocab_pipeline.beam_word_counts(files, flags=flags)
    assert list(beam_temp.iterdir()) == [] and not [p for p in system_temp.iterdir() if "kbert" in p.name]
