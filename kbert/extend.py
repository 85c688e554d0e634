"""`kbert extend`: a model grown into a new model directory, starting from what it knows.

Two growths, alone or together:
- More positions (`--max-position-embeddings N`), for texts longer than the
  `max_position_embeddings` the model was trained with. The position table's learned rows are
  copied again and again, as Longformer grew RoBERTa's 512 positions to 4,096 (Beltagy et al.,
  2020): position p of the new table starts as position p mod P of the old one. A text of at
  most P tokens gives exactly the outputs it gave; the positions past P then learn their own
  values in continued pretraining at the new length (`kbert pretrain --init OUT --max-seq-length N`).
- More words (`--words FILE`, or `--corpus FILES --max-new N`): a domain's terms become tokens
  of their own (`kbert.new_words` chooses them and gives them ids: `[unusedN]` slots first, then
  new ids past the last). Each new word-embedding row starts as the mean of the rows of the
  pieces the word used to be split into, and so does its masked-LM output bias (the decoder is
  tied to the embeddings). No old token changes its id or its weights, so a text none of whose
  words begins with a new word tokenizes and computes exactly as before, and checkpoints of
  the old model keep their meaning.

Each growth is one function on a model (`extend_positions`, `extend_vocabulary`); `extend` runs
the ones asked for on a model source and saves the result.
"""

from __future__ import annotations

import logging
import numbers
import os
import tempfile

import numpy as np

import kbert.finetuning.tasks  # noqa: F401  (how save checks a grown task model's record: its task's answer)
from kbert import new_words
from kbert.formats.model_dir import model_kind, save
from kbert.formats.sources import describe_source, open_model
from kbert.model.bert import Vocabulary, encoder_of
from kbert.model.initializers import unfilled
from kbert.runtime.errors import KbertError, option
from kbert.runtime.files import atomic_write_text, writes
from kbert.text.tokenizer import Tokenizer, vocab_tokens

log = logging.getLogger("kbert")

# Occurrences a corpus word needs before `--corpus` considers it (--min-count).
DEFAULT_MIN_COUNT = 5
# The most positions extend grows a model to. BERT's attention is full: at N tokens each layer
# holds N² scores a head, 4 GiB a head at this length, so no longer text could run on it.
MAX_POSITIONS = 32768
# The growth options, named when none is given.
GROWTH_OPTIONS = "--max-position-embeddings N, --words FILE, or --corpus FILES --max-new N"


def tiled_rows(table, rows: int):
    """`table`'s rows repeated in order until there are `rows` of them (the last copy cut short):
    row i of the result is row i mod len(table).

    Example:
    >>> tiled_rows(np.array([[1.0], [2.0], [3.0]]), 7)[:, 0].tolist()
    [1.0, 2.0, 3.0, 1.0, 2.0, 3.0, 1.0]
    """
    table = np.asarray(table)
    return table[np.arange(rows) % len(table)]


def check_positions(current: int, requested) -> int:
    """`requested` as an int, if it is more positions than the model's `current`; else a one-line error.

    >>> check_positions(512, 1024)
    1024
    >>> check_positions(512, 10**9)
    Traceback (most recent call last):
    kbert.runtime.errors.KbertError: max_position_embeddings=1000000000: at most 32768 (full attention at N tokens holds N² scores a head, 4 GiB each at 32768); for longer texts, fine-tune with `kbert finetune --long-text windows`
    >>> check_positions(512, 512)
    Traceback (most recent call last):
    kbert.runtime.errors.KbertError: max_position_embeddings=512: the model has 512 positions already; give more than 512 (extend only grows a model)
    """
    if isinstance(requested, bool) or not isinstance(requested, numbers.Integral):
        raise KbertError(
            f"{option('max_position_embeddings', requested)}: give a whole number of positions, more than {current}"
        )
    if requested <= current:
        raise KbertError(
            f"{option('max_position_embeddings', requested)}: the model has {current} positions already; give more than "
            f"{current} (extend only grows a model)"
        )
    if requested > MAX_POSITIONS:
        raise KbertError(
            f"{option('max_position_embeddings', requested)}: at most {MAX_POSITIONS} (full attention at N tokens holds N² "
            f"scores a head, 4 GiB each at {MAX_POSITIONS}); for longer texts, fine-tune with `kbert finetune --long-text windows`"
        )
    return int(requested)


def extend_positions(model, max_position_embeddings: int):
    """A copy of `model` with `max_position_embeddings` positions, its position table the old
    one's rows copied again and again (Longformer's recipe); every other weight as it was.

    The copy is of the same class, with the same head, task, vocabulary and casing. Texts of at
    most the old number of positions give the same outputs from it; longer ones read position p
    as the old model read position p mod P, until continued pretraining teaches it more.

    Args:
        model: a kbert model (`kbert.load`, `bert_encoder`, `bert_pretrainer`, or one with a
            task head).
        max_position_embeddings: int. The new model's positions: more than `model` has.

    Example:
    >>> import numpy as np, kbert
    >>> config = kbert.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1,
    ...                           num_attention_heads=4, intermediate_size=64, max_position_embeddings=16)
    >>> longer = extend_positions(kbert.bert_pretrainer(config), 40)
    >>> type(longer).__name__, longer.config.max_position_embeddings
    ('BertPretrainer', 40)
    >>> table = longer.encoder.embeddings.position_embeddings.embeddings.numpy()
    >>> table.shape, bool((table[16:32] == table[:16]).all() and (table[32:] == table[:8]).all())
    ((40, 32), True)
    """
    positions = check_positions(_kbert_model(model).config.max_position_embeddings, max_position_embeddings)
    table = encoder_of(model).embeddings.position_embeddings.embeddings.path
    return _regrown(model, {"max_position_embeddings": positions}, {table: lambda value: tiled_rows(value, positions)})


def _kbert_model(model):
    try:
        model_kind(model)
    except KbertError:
        raise KbertError(
            f"cannot extend a {type(model).__name__}: pass a kbert model (kbert.load(MODEL_DIR), kbert.bert_pretrainer, ...)"
        ) from None
    return model


def _regrown(model, config_changes: dict, grow: dict, vocabulary: Vocabulary | None = None):
    """`model` rebuilt with `config_changes`, each weight copied, or passed through `grow[path]`."""
    described = model.get_config()  # class, head, task_info and vocabulary: everything but the weights
    described["config"] = {**described["config"], **config_changes}
    if vocabulary is not None:
        described["vocabulary"] = vocabulary.to_dict()
    with unfilled():  # every weight is assigned below
        grown = type(model).from_config(described)
    old = {variable.path: variable for variable in model.weights}
    for variable in grown.weights:
        if variable.path not in old:  # a guard: both models are built by the same class
            raise RuntimeError(f"kbert bug: {variable.path} of the grown model is not in the model it grew from")
        value = old[variable.path].numpy()
        variable.assign(grow[variable.path](value) if variable.path in grow else value)
    return grown


def rows_for_new_words(table, size: int, ids, piece_ids):
    """`table` ([V, ...]) grown to `size` rows, row `ids[i]` set to the mean of the rows
    `piece_ids[i]`: each new word starts as the average of the pieces it used to be split into.

    Example:
    >>> rows_for_new_words(np.array([1.0, 2.0, 4.0]), 4, [0, 3], [[1, 2], [2]]).tolist()
    [3.0, 2.0, 4.0, 4.0]
    """
    table = np.asarray(table)
    grown = np.zeros((size, *table.shape[1:]), dtype=table.dtype)
    grown[: len(table)] = table
    for index, pieces in zip(ids, piece_ids):
        grown[index] = table[list(pieces)].mean(axis=0, dtype=np.float64).astype(table.dtype)
    return grown


def extend_vocabulary(model, words, vocab_file):
    """A copy of `model` that knows `words`, and where they went.

    The words are checked (`kbert.new_words.check_words`: one word each to the model's basic
    tokenizer, not in its vocabulary) and placed: the vocabulary's `[unusedN]` slots first, in id
    order, then appended (`place_words`). The new vocabulary is written to `vocab_file`, which
    the returned model declares. Each word's embedding row and, for a pretrainer, its masked-LM
    output bias start as the mean of the pieces the word used to be split into; every other
    weight, and every old token's id, stays as it was.

    Args:
        model: a kbert model with its vocabulary (`kbert.load`, or built with `vocabulary=`).
        words: list of str. The words to add.
        vocab_file: str. Where to write the grown vocab.txt.

    Returns: (model, placement), placement being {"words": the words as the tokenizer sees
        them, "ids": their ids, "slots": how many went into [unusedN] slots, "appended": how many
        past the old vocabulary, "vocab_size": {"from", "to"}}.

    Example:
    >>> import tempfile, kbert
    >>> tiny = kbert.converters.load_tf1_checkpoint("tests/fixtures/tf1-tiny")
    >>> vocab = os.path.join(tempfile.mkdtemp(), "vocab.txt")
    >>> grown, placement = extend_vocabulary(tiny, ["Debian", "dpkg", "apt", "systemd"], vocab)
    >>> placement["slots"], placement["appended"], placement["vocab_size"]
    (3, 1, {'from': 300, 'to': 301})
    """
    _kbert_model(model)
    if not model.vocab_file:
        raise KbertError("the model declares no vocabulary to extend: load it with kbert.load(MODEL_DIR)")
    tokenizer = Tokenizer(model.vocab_file, model.do_lower_case)
    words = new_words.check_words(words, tokenizer)
    old_tokens = vocab_tokens(model.vocab_file)
    tokens, ids, slotted = new_words.place_words(old_tokens, words)
    piece_ids = new_words.old_piece_ids(words, tokenizer)
    # The old lines as they are, byte for byte (a google-research round trip keeps the file).
    with open(model.vocab_file, encoding="utf-8", newline="\n") as f:
        lines = f.read().split("\n")
    if lines[-1] == "":
        lines.pop()
    for word, index in zip(words, ids):
        lines[index : index + 1] = [word]
    atomic_write_text(vocab_file, "".join(f"{line}\n" for line in lines))
    grow = lambda value: rows_for_new_words(value, len(tokens), ids, piece_ids)  # noqa: E731
    paths = {encoder_of(model).embeddings.word_embeddings.embeddings.path: grow}
    if hasattr(model, "mlm_head"):
        paths[model.mlm_head.output_bias.path] = grow
    grown = _regrown(model, {"vocab_size": len(tokens)}, paths, Vocabulary(os.fspath(vocab_file), model.do_lower_case))
    placement = {
        "words": words,
        "ids": ids,
        "slots": slotted,
        "appended": len(words) - slotted,
        "vocab_size": {"from": len(old_tokens), "to": len(tokens)},
    }
    return grown, placement


def _check_word_options(corpus, max_new, min_count):
    if corpus and max_new is None:
        raise KbertError(f"{option('corpus')} needs {option('max_new')}: the most words to choose from it")
    if max_new is not None and not corpus:
        raise KbertError(f"{option('max_new', max_new)} chooses words from a corpus: pass {option('corpus')}")
    if max_new is not None and (isinstance(max_new, bool) or not isinstance(max_new, numbers.Integral) or max_new < 1):
        raise KbertError(f"{option('max_new', max_new)}: give how many words to add, 1 or more")
    if isinstance(min_count, bool) or not isinstance(min_count, numbers.Integral) or min_count < 1:
        raise KbertError(f"{option('min_count', min_count)}: give the occurrences a word needs, 1 or more")


def corpus_tokens(word_counts, tokenizer: Tokenizer) -> int:
    """WordPiece tokens a corpus makes under `tokenizer`, from its word counts."""
    return sum(count * len(tokenizer.wordpiece(word)) for word, count in word_counts.items())


def choose_words(
    source,
    words_file=None,
    corpus=(),
    max_new: int | None = None,
    min_count: int = DEFAULT_MIN_COUNT,
    do_lower_case=None,
    on_progress=None,
) -> dict:
    """The words `kbert extend` would add to the model at `source`, and what they save; no
    weight is read and nothing is written (`kbert extend --dry-run` prints this).

    Args:
        source: str. A model source, as `extend` takes.
        words_file: str. Words to add, one a line (`new_words.read_words`, `check_words`).
        corpus: list of str. Text files: choose up to `max_new` more words from them, those that
            save the most tokens (occurrences × pieces saved, `new_words.candidates`).
        max_new: int. With `corpus`: words to choose at most.
        min_count: int. With `corpus`: occurrences a word needs.
        do_lower_case: bool. The vocabulary's casing; default: what the source records.
        on_progress: callable(bytes_read, bytes_in_all), called as the corpus is counted.

    Returns: {"words": [{"word", "pieces", and with a corpus "count", "saves"}], "slots",
        "appended", "vocab_size": {"from", "to"}, and with a corpus "corpus_tokens": {"before",
        "after"}, the corpus's WordPiece tokens under the old vocabulary and the new one}.

    Example:
    >>> chosen = choose_words("tests/fixtures/tf1-tiny", corpus=["tests/fixtures/sample_text.txt"], max_new=2, min_count=2)
    >>> [(w["word"], w["count"], len(w["pieces"]), w["saves"]) for w in chosen["words"]]
    [('philammon', 3, 9, 24), ('indeed', 2, 5, 8)]
    >>> chosen["slots"], chosen["appended"], chosen["corpus_tokens"]
    (2, 0, {'before': 2016, 'after': 1984})
    """
    _check_word_options(corpus, max_new, min_count)
    info = describe_source(source)
    casing = info.do_lower_case if do_lower_case is None else bool(do_lower_case)
    tokenizer = Tokenizer(info.vocab_file, casing)
    named = new_words.check_words(new_words.read_words(words_file), tokenizer) if words_file else []
    chosen = [{"word": word, "pieces": tokenizer.wordpiece(word)} for word in named]
    result = {}
    if corpus:
        from kbert.text.vocab_builder import count_words

        counts = count_words(list(corpus), casing, on_progress)
        picked = new_words.candidates(counts, tokenizer, min_count, exclude=named)[:max_new]
        if not picked:
            raise KbertError(
                f"{option('corpus')}: no word seen {min_count} times or more is split by the vocabulary; lower {option('min_count')} "
                "or pass more text"
            )
        if len(picked) < max_new:  # said, not refused: the words that qualify are still worth adding
            log.warning(
                "%s: only %d words are seen %d times or more and split by the vocabulary; adding those "
                "(lower %s or pass more text for more)",
                option("max_new", max_new),
                len(picked),
                min_count,
                option("min_count"),
            )
        for entry in chosen:
            entry.update(
                count=int(counts.get(entry["word"], 0)),
                saves=int(counts.get(entry["word"], 0)) * (len(entry["pieces"]) - 1),
            )
        chosen += [candidate.to_dict() for candidate in picked]
        grown_tokens, _, _ = new_words.place_words(vocab_tokens(info.vocab_file), [c["word"] for c in chosen])
        with tempfile.TemporaryDirectory(prefix="kbert-vocab-") as folder:
            grown_vocab = os.path.join(folder, "vocab.txt")
            atomic_write_text(grown_vocab, "".join(f"{token}\n" for token in grown_tokens))
            # Counted with the new vocabulary itself: a new word also shortens the longer words it begins.
            after = corpus_tokens(counts, Tokenizer(grown_vocab, casing))
        result["corpus_tokens"] = {"before": corpus_tokens(counts, tokenizer), "after": after}
    old_tokens = vocab_tokens(info.vocab_file)
    _, _, slotted = new_words.place_words(old_tokens, [c["word"] for c in chosen])
    return {
        "words": chosen,
        "slots": slotted,
        "appended": len(chosen) - slotted,
        "vocab_size": {"from": len(old_tokens), "to": len(old_tokens) + len(chosen) - slotted},
        **result,
    }


@writes("out", inputs=("source",))
def extend(
    source,
    out,
    max_position_embeddings: int | None = None,
    *,
    words_file=None,
    corpus=(),
    max_new: int | None = None,
    min_count: int = DEFAULT_MIN_COUNT,
    do_lower_case=None,
    overwrite=False,
    on_progress=None,
) -> dict:
    """Grow the model at `source` and save it as the kbert model directory `out`, atomically.

    Args:
        source: str. A kbert model directory, a `.keras` file, or a google-research checkpoint
            directory or prefix (as every command takes).
        out: str. The model directory to write, of the same kind as `source`'s model (encoder,
            pretrainer, or fine-tuned with its head and task), with its vocab.txt and casing.
        max_position_embeddings: int. The new number of positions, more than the model has
            (`extend_positions`).
        words_file, corpus, max_new, min_count, on_progress: the words to add (`choose_words`,
            `extend_vocabulary`).
        do_lower_case: bool. The vocabulary's casing; default: what the source records (a
            google-research checkpoint's is guessed from its folder name, `lower_case_for`).
        overwrite: bool. Replace a non-empty `out`.

    Returns: what `kbert extend` prints: {"model_dir", "kbert_model", "parameters"}, and
        "max_position_embeddings": {"from", "to"} when it grew positions, "new_words": {"added",
        "slots", "appended", "words"} and "vocab_size": {"from", "to"} when it grew words.

    Example:
    >>> import tempfile
    >>> out = os.path.join(tempfile.mkdtemp(), "tiny-256")
    >>> extend("tests/fixtures/tf1-tiny", out, max_position_embeddings=256)["max_position_embeddings"]
    {'from': 64, 'to': 256}
    """
    # The refusals read only the config, the vocabulary and the text: they come before the weights are loaded.
    positions = describe_source(source).config.max_position_embeddings
    _check_word_options(corpus, max_new, min_count)
    if max_position_embeddings is None and not words_file and not corpus:
        raise KbertError(f"nothing to grow: pass {GROWTH_OPTIONS} (the model has {positions} positions)")
    if max_position_embeddings is not None:
        check_positions(positions, max_position_embeddings)
    chosen = None
    if words_file or corpus:
        chosen = choose_words(source, words_file, corpus, max_new, min_count, do_lower_case, on_progress)
    grown = open_model(source, do_lower_case)
    result = {}
    with tempfile.TemporaryDirectory(prefix="kbert-vocab-") as folder:
        if chosen is not None:
            if not new_words.unused_slots(vocab_tokens(grown.vocab_file)):
                log.info("the vocabulary has no [unusedN] slots: the %d new words are appended", len(chosen["words"]))
            grown, placement = extend_vocabulary(
                grown, [c["word"] for c in chosen["words"]], os.path.join(folder, "vocab.txt")
            )
            result["new_words"] = {
                "added": len(placement["words"]),
                "slots": placement["slots"],
                "appended": placement["appended"],
                "words": placement["words"],
            }
            result["vocab_size"] = placement["vocab_size"]
            if "corpus_tokens" in chosen:
                result["corpus_tokens"] = chosen["corpus_tokens"]
        if max_position_embeddings is not None:
            grown = extend_positions(grown, max_position_embeddings)
            result["max_position_embeddings"] = {"from": positions, "to": grown.config.max_position_embeddings}
        save(grown, out, overwrite=overwrite)
    return {
        "model_dir": os.fspath(out),
        "kbert_model": model_kind(grown),
        "parameters": int(grown.count_params()),
        **result,
    }
