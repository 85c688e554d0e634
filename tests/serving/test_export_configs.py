"""`kbert export` keeps the user's models.config and batching_parameters.txt.

Each export adds what it must to models.config (its model, or its version where the model is
pinned to specific versions) as an edit of the user's text, checked by parsing it with TF
Serving's own proto; a file it cannot edit that way, and a batching_parameters.txt that differs
from kbert's, are left as they are, with kbert's version beside them as `.new`.
"""

import contextlib
import json
import logging
import os
import re
import shutil
from pathlib import Path

import pytest
from google.protobuf import text_format
from tensorflow_serving.config import model_server_config_pb2

from conftest import run_kbert
from kbert.serving.models_config import (
    _batching_parameters,
    _models_config,
    _models_config_with,
    write_batching_parameters,
    write_models_config,
)

BASE = "/srv/exports/sentiment"


def parse(text):
    return text_format.Parse(text, model_server_config_pb2.ModelServerConfig())


def models(text):
    return {
        m.name: (m.base_path, sorted(m.model_version_policy.specific.versions))
        for m in parse(text).model_config_list.config
    }


USERS = """# our server: docker mounts the exports at /models
model_config_list {
  config {
    name: "sentiment"
    base_path: "/models/sentiment"  # the docker path, not the export's
    model_platform: "tensorflow"
    model_version_policy { specific { versions: 1 } }
    version_labels { key: "stable" value: 1 }
  }
  config {
    name: "other"
    base_path: "/models/other"
    model_platform: "tensorflow"
    model_version_policy {
      specific {
        versions: 3
      }
    }
  }
}
"""


def test_a_pinned_model_gets_the_new_version_and_the_rest_is_kept():
    text, note = _models_config_with(USERS, "sentiment", BASE, 2)
    assert note == "added version 2 to the specific versions of model 'sentiment'"
    assert models(text) == {"sentiment": ("/models/sentiment", [1, 2]), "other": ("/models/other", [3])}
    # The user's text is edited, not rewritten: comments and layout stay, one line changes.
    changed = [(a, b) for a, b in zip(USERS.splitlines(), text.splitlines()) if a != b]
    assert changed == [
        (
            "    model_version_policy { specific { versions: 1 } }",
            "    model_version_policy { specific { versions: 1 versions: 2 } }",
        )
    ]
    assert parse(text).model_config_list.config[0].version_labels["stable"] == 1
    text, _ = _models_config_with(text, "other", BASE, 4)
    assert models(text)["other"] == ("/models/other", [3, 4]) and "# the docker path" in text


def test_a_new_model_is_added_and_latest_policies_need_nothing():
    text, note = _models_config_with(USERS, "similarity", BASE, 1)
    assert note == "added model 'similarity'" and text.startswith(USERS.rsplit("}", 1)[0])
    assert models(text)["similarity"] == (BASE, [])
    ours = _models_config("sentiment", BASE)
    assert _models_config_with(ours, "sentiment", BASE, 7) == (ours, None)  # serves the newest anyway
    assert models(_models_config_with("# nothing yet\n", "x", BASE, 1)[0]) == {"x": (BASE, [])}
    lists = 'model_config_list: { config: { name: "x", base_path: "/y", model_version_policy: { specific: { versions: [1, 2] } } } }'
    assert models(_models_config_with(lists, "x", BASE, 5)[0]) == {"x": ("/y", [1, 2, 5])}


@pytest.mark.parametrize(
    "text, why",
    [
        ("model_config_list { config { name: 'x' base_path: '/y' }", "not a model_config_list that TF Serving reads"),
        ("model_config_list { config { name: 'x' } config { name: 'x' } }", "it names model 'x' 2 times"),
        ("custom_model_config { }", "it holds a custom_model_config"),
    ],
)
def test_a_file_that_cannot_be_edited_safely_is_said_so(text, why):
    updated, note = _models_config_with(text, "x", BASE, 3)
    assert updated is None and note.startswith(why)


@contextlib.contextmanager
def said():
    """The lines kbert logs meanwhile (what `kbert export` prints on stderr after "kbert: ")."""
    lines, logger = [], logging.getLogger("kbert")
    handler = logging.Handler(logging.INFO)
    handler.emit = lambda record: lines.append(record.getMessage())
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield lines
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def test_the_first_export_writes_both_files(tiny_encoder_export):
    base, first = tiny_encoder_export
    assert first["model_config_file"] == str(base / "models.config")
    assert models((base / "models.config").read_text()) == {"tiny_encoder": (str(base), [])}
    assert (base / "batching_parameters.txt").read_text() == _batching_parameters(os.cpu_count())


def test_a_later_export_keeps_the_users_edits(tmp_path):
    """What an export of version 2, then 3, writes beside the user's edited files (the files are
    written after the SavedModel, by write_models_config and write_batching_parameters)."""
    base = tmp_path / "tiny"
    base.mkdir()
    config_file, batching_file = write_models_config(str(base), "tiny", 1), write_batching_parameters(str(base))
    assert (config_file, batching_file) == (str(base / "models.config"), str(base / "batching_parameters.txt"))
    config_file, batching_file = base / "models.config", base / "batching_parameters.txt"
    kberts_batching = batching_file.read_text()

    # What the README tells users to do: tune the batching, and here pin the served versions.
    users_batching = re.sub(
        r"num_batch_threads \{ value: \d+ \}",
        "# ours: the box runs two servers\nnum_batch_threads { value: 1 }",
        kberts_batching,
    )
    batching_file.write_text(users_batching)
    users_config = config_file.read_text().replace(
        '    model_platform: "tensorflow"\n',
        '    model_platform: "tensorflow"\n    model_version_policy { specific { versions: 1 } }  # pinned\n',
    )
    config_file.write_text(users_config)

    with said() as lines:
        assert write_models_config(str(base), "tiny", 2) == str(config_file)
        assert write_batching_parameters(str(base)) == f"{batching_file}.new"
    assert batching_file.read_text() == users_batching  # kept, byte for byte
    assert (base / "batching_parameters.txt.new").read_text() == kberts_batching
    assert models(config_file.read_text()) == {"tiny": (str(base), [1, 2])}
    assert config_file.read_text() == users_config.replace("versions: 1 }", "versions: 1 versions: 2 }")
    assert lines == [
        f"{config_file}: added version 2 to the specific versions of model 'tiny'",
        f"{batching_file} differs from what kbert writes: kept as it is; kbert's is beside it: {batching_file}.new",
    ]

    # A models.config kbert cannot edit safely is left as it is, and kbert's goes beside it.
    broken = users_config.replace("model_config_list {", "model_config_list {{", 1)
    config_file.write_text(broken)
    with said() as lines:
        assert write_models_config(str(base), "tiny", 3) == f"{config_file}.new"
    assert config_file.read_text() == broken
    assert (base / "models.config.new").read_text() == _models_config("tiny", str(base))
    assert len(lines) == 1 and lines[0].startswith(f"{config_file}: not a model_config_list that TF Serving reads ")
    assert lines[0].endswith(
        f"left as it is, and kbert's models.config for this export is beside it: {config_file}.new"
    )
    # Nothing half-written or temporary beside them.
    assert sorted(os.listdir(base)) == [
        "batching_parameters.txt",
        "batching_parameters.txt.new",
        "models.config",
        "models.config.new",
    ]


@pytest.mark.slow
def test_a_model_renamed_in_models_config_keeps_its_entry(tmp_path, tiny_model_dir, tiny_encoder_export):
    """The user renames the model to `prod` and pins version 1: the next export finds its entry
    by base_path, adds version 2 to it, and adds no second entry with the same base_path; the
    export's JSON and the server's files say so, as `kbert export` prints them."""
    base = tmp_path / "tiny"
    shutil.copytree(tiny_encoder_export[0] / "1", base / "1")  # version 1, exported before
    config_file = Path(write_models_config(str(base), "tiny", 1))
    write_batching_parameters(str(base))
    config_file.write_text(
        config_file.read_text()
        .replace('name: "tiny"', 'name: "prod"')
        .replace(
            '    model_platform: "tensorflow"\n',
            '    model_platform: "tensorflow"\n    model_version_policy { specific { versions: 1 } }\n',
        )
    )
    second = run_kbert("export", tiny_model_dir, base, "--max-seq-length", "16")
    assert json.loads(second.stdout)["version"] == 2
    assert models(config_file.read_text()) == {"prod": (str(base), [1, 2])}
    assert f"kbert: {config_file}: added version 2 to the specific versions of model 'prod'" in second.stderr
    assert sorted(os.listdir(base)) == ["1", "2", "batching_parameters.txt", "models.config"]
    # The warmup requests name the model as the server serves it.
    import tensorflow as tf
    from tensorflow_serving.apis import prediction_log_pb2

    record = next(iter(tf.data.TFRecordDataset(str(base / "2" / "assets.extra" / "tf_serving_warmup_requests"))))
    log = prediction_log_pb2.PredictionLog.FromString(record.numpy())
    assert log.predict_log.request.model_spec.name == "prod"
