"""The one loop of prediction: a file's examples, a batch at a time, into one JSON-ready row each.

`kbert predict` (local and `--server`) and `kbert embed` stream their rows through `stream_rows`,
so a resumed run starts at the same example and `--skip-bad-rows` numbers rows the same way.
"""

from __future__ import annotations

from collections.abc import Iterator

from kbert.runtime.errors import KbertError, option


def check_start(start):
    """A one-line error unless `start` (examples to skip) is a whole number, 0 or more.

    >>> check_start(-1)
    Traceback (most recent call last):
    ...
    kbert.runtime.errors.KbertError: start -1: give the number of examples to skip, 0 or more
    """
    if isinstance(start, bool) or not isinstance(start, int) or start < 0:
        raise KbertError(f"start {start!r}: give the number of examples to skip, 0 or more")


def select_examples(examples, first: int, stop: int):
    """Examples `first` to `stop` of a file's (a readers' examples object, or a list).

    >>> select_examples(["q1", "q2", "q3"], 1, 3)
    ['q2', 'q3']
    """
    return examples[first:stop] if isinstance(examples, list) else examples.select(first, stop)


def example_lines(examples) -> list | None:
    """The line each example starts on, or None where the file has no lines (SQuAD's JSON)."""
    return None if isinstance(examples, list) else examples.lines


def stream_rows(examples, answer, batch_size: int, start: int = 0, with_lines: bool = False) -> Iterator[dict]:
    """The rows of a file's `examples` from example `start` on, `batch_size` examples at a
    time: the one loop of local and served prediction.

    Args:
        examples: a file's examples (`Task.read_examples`, `readers.read_feature_texts`), or a list.
        answer: callable. Given a batch of examples (`select_examples`) and the index of its
            first, returns one JSON-ready dict per example, in order.
        batch_size: int. Examples per batch.
        start: int. The first example to answer (resuming); an error if past the end.
        with_lines: bool. Add each row's input line (`"line"`, 1-based), where rows of the
            input may have been skipped (`--skip-bad-rows`).

    Example:
    >>> from kbert.finetuning.readers import TextExamples
    >>> examples = TextExamples(["a", "b", "c"], None, None, "tsv", skipped_rows=[2], replaced_bytes=0, lines=[1, 3, 4])
    >>> list(stream_rows(examples, lambda part, first: [{"text": t} for t in part.texts], 2, start=1, with_lines=True))
    [{'line': 3, 'text': 'b'}, {'line': 4, 'text': 'c'}]
    """
    n = len(examples)
    if start > n:
        raise KbertError(
            f"the output to resume already has {start} rows, but the input has only {n} "
            f"examples: it is not this input's output; pass {option('overwrite', True)} to start again"
        )
    return _stream(examples, answer, batch_size, start, with_lines)


def _stream(examples, answer, batch_size, start, with_lines):
    n = len(examples)
    for first in range(start, n, batch_size):
        part = select_examples(examples, first, min(first + batch_size, n))
        lines = example_lines(part) if with_lines else None
        rows = answer(part, first)
        if lines is None:
            yield from rows
        else:
            for line, row in zip(lines, rows, strict=True):
                yield {"line": line, **row}
