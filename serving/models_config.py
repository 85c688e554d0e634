"""The files `tensorflow_model_server` reads beside an export's versions: `EXPORT_BASE/models.config`
(which model to serve from where) and `EXPORT_BASE/batching_parameters.txt` (server-side batching).

`kbert export` writes both, but never over a user's own: a models.config is edited as text so
that it also serves the new version (its comments and layout kept), and one that cannot be
edited safely, like a batching_parameters.txt that differs from kbert's, is left as it is with
kbert's beside it as `.new`, said on stderr.
"""

from __future__ import annotations

import logging
import os
import re

from google.protobuf import text_format
from tensorflow_serving.config import model_server_config_pb2

from kbert.runtime.errors import first_line
from kbert.runtime.files import atomic_write_text

log = logging.getLogger("kbert")

MODELS_CONFIG = "models.config"
BATCHING_PARAMETERS = "batching_parameters.txt"
MODELS_CONFIG_HEADER = (
    "# tensorflow_model_server --model_config_file=THIS_FILE: serves the newest version under base_path.\n"
)


def _model_entry(name: str, export_base: str) -> str:
    """One `config { ... }` of a model_config_list, indented as kbert writes it (text_format quotes the path)."""
    fields = text_format.MessageToString(
        model_server_config_pb2.ModelConfig(name=name, base_path=export_base, model_platform="tensorflow"), as_utf8=True
    )
    return "  config {\n" + "".join(f"    {line}\n" for line in fields.splitlines()) + "  }\n"


def _models_config(name: str, export_base: str) -> str:
    return MODELS_CONFIG_HEADER + "model_config_list {\n" + _model_entry(name, export_base) + "}\n"


def _parse_models_config(text: str):
    config = model_server_config_pb2.ModelServerConfig()
    text_format.Parse(text, config)
    return config


def _versions_sorted(config):
    """`config` with each model's specific versions in order: TF Serving reads them as a set."""
    for model in config.model_config_list.config:
        versions = sorted(model.model_version_policy.specific.versions)
        if versions:
            del model.model_version_policy.specific.versions[:]
            model.model_version_policy.specific.versions.extend(versions)
    return config


def _edits(text: str, anchors: str, insert: str):
    """`text` with `insert` put in where each match of the regex `anchors` has its group `at`, the
    last match first (on a line of its own when `at` starts one): the candidates that
    `_models_config_with` verifies by parsing."""
    for match in reversed(list(re.finditer(anchors, text))):
        at = match.start("at")
        line_start = text.rfind("\n", 0, at) + 1
        if not text[line_start:at].strip():  # a "}" alone on its line: insert the lines above it
            at = line_start
        yield text[:at] + insert + text[at:]


def _models_config_with(text: str, name: str, export_base: str, version: int):
    """(`text` updated to serve `version` of model `name`, what was added or None) or (None,
    why it cannot be).

    The user's file is edited as text, never re-written from the parsed proto, so their comments
    and layout stay; an edit is kept only if the result parses to exactly the intended config.
    The model is the entry whose base_path is `export_base` (the user may have renamed it),
    else the one named `name`. One it does not hold is added (base_path `export_base`); a model
    pinned to `specific` versions gets `version` added; otherwise (latest or all versions)
    nothing needs to change.
    """
    try:
        config = _parse_models_config(text)
    except text_format.ParseError as e:
        return None, f"not a model_config_list that TF Serving reads ({first_line(e)})"
    if config.HasField("custom_model_config"):
        return None, "it holds a custom_model_config, which kbert does not edit"
    same_base = [m for m in config.model_config_list.config if _same_path(m.base_path, export_base)]
    models = same_base or [m for m in config.model_config_list.config if m.name == name]
    wanted = model_server_config_pb2.ModelServerConfig()
    wanted.CopyFrom(config)
    if len(models) > 1:
        return None, (
            f"it serves {export_base} {len(models)} times"
            if same_base
            else f"it names model {name!r} {len(models)} times"
        )
    if not models:
        wanted.model_config_list.config.add(name=name, base_path=export_base, model_platform="tensorflow")
        entry = _model_entry(name, export_base)
        start = text.rstrip("\n") + "\n" if text.strip() else ""
        candidates = list(_edits(text, r"(?P<at>)\}", entry)) + [start + "model_config_list {\n" + entry + "}\n"]
        what = f"model {name!r}"
    else:
        policy = models[0].model_version_policy
        if policy.WhichOneof("policy_choice") != "specific" or version in policy.specific.versions:
            return text, None  # TF Serving picks the new version up as the file stands
        name = models[0].name
        next(
            m for m in wanted.model_config_list.config if m.name == name
        ).model_version_policy.specific.versions.append(version)
        candidates = list(_edits(text, r"specific\s*:?\s*\{[^{}]*?(?P<at>)\s*\}", f" versions: {version}"))
        what = f"version {version} to the specific versions of model {name!r}"
    for candidate in candidates:
        try:
            if _versions_sorted(_parse_models_config(candidate)) == _versions_sorted(wanted):
                return candidate, f"added {what}"
        except text_format.ParseError:
            continue
    return None, f"kbert could not add {what} to it as text and keep the rest as it is"


def _same_path(base_path: str, export_base: str) -> bool:
    return os.path.realpath(base_path) == os.path.realpath(export_base)


def configured_name(export_base: str) -> str | None:
    """The name EXPORT_BASE/models.config serves EXPORT_BASE under, if it names it (a user who
    renamed the model there keeps that name on the next export), else None."""
    try:
        with open(os.path.join(export_base, MODELS_CONFIG), encoding="utf-8") as f:
            config = _parse_models_config(f.read())
    except (OSError, UnicodeDecodeError, text_format.ParseError):
        return None
    names = [m.name for m in config.model_config_list.config if _same_path(m.base_path, export_base)]
    return names[0] if len(names) == 1 else None


def write_models_config(export_base: str, name: str, version: int) -> str:
    """Write EXPORT_BASE/models.config, or update the user's so that it serves `version`.

    A file that cannot be updated safely is left as it is, with kbert's beside it as
    models.config.new (said on stderr). Returns the path written.
    """
    path = os.path.join(export_base, MODELS_CONFIG)
    if not os.path.exists(path):
        atomic_write_text(path, _models_config(name, export_base))
        return path
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        updated, note = _models_config_with(text, name, export_base, version)
    except UnicodeDecodeError:
        updated, note = None, "not UTF-8 text"
    if updated is None:
        atomic_write_text(path + ".new", _models_config(name, export_base))
        log.warning(
            "%s: %s; left as it is, and kbert's models.config for this export is beside it: %s.new", path, note, path
        )
        return path + ".new"
    if updated != text:
        atomic_write_text(path, updated)
        log.info("%s: %s", path, note)
    return path


def write_batching_parameters(export_base: str) -> str:
    """Write EXPORT_BASE/batching_parameters.txt; never over a different one (the user's
    tuning): then kbert's goes beside it as batching_parameters.txt.new, said on stderr."""
    path = os.path.join(export_base, BATCHING_PARAMETERS)
    ours = _batching_parameters(os.cpu_count() or 1)
    if not os.path.exists(path):
        atomic_write_text(path, ours)
        return path
    with open(path, encoding="utf-8", errors="replace") as f:
        if f.read() == ours:
            return path
    atomic_write_text(path + ".new", ours)
    log.warning("%s differs from what kbert writes: kept as it is; kbert's is beside it: %s.new", path, path)
    return path + ".new"


def _batching_parameters(cores: int) -> str:
    return (
        "# tensorflow_model_server --enable_batching --batching_parameters_file=THIS_FILE\n"
        "# Server-side batching: requests that arrive together run as one batch, which keeps\n"
        "# the accelerator (or all CPU cores) busy under load. Starting points; tune on your traffic.\n"
        "#\n"
        "# Largest batch: once a batch keeps the cores busy, BERT's cost grows linearly with its\n"
        "# size, so bigger batches add latency without adding much throughput; lower it for long\n"
        "# max_seq_length.\n"
        "max_batch_size { value: 32 }\n"
        "# How long the first request of a batch waits for others: 2 ms is small next to one\n"
        "# BERT-base forward pass (tens of ms), so a lightly loaded server barely notices it.\n"
        "batch_timeout_micros { value: 2000 }\n"
        f"# One batch per core of the machine that ran `kbert export` ({cores}); set it to the\n"
        "# serving machine's cores (on a GPU, 1-4 batch threads are enough).\n"
        f"num_batch_threads {{ value: {cores} }}\n"
        "# Bound the queue: past this many waiting batches the server answers UNAVAILABLE at once,\n"
        "# so an overloaded server sheds load instead of letting every request's latency grow.\n"
        f"max_enqueued_batches {{ value: {max(4, 2 * cores)} }}\n"
        "# The inputs are strings [batch] (tokenized and padded inside the graph) or ids already\n"
        "# padded by the client, so there is nothing for the batcher to pad.\n"
        "pad_variable_length_inputs: false\n"
    )
