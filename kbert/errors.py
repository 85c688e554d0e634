"""The one exception type for user errors: the CLI prints its message as one line and exits 1."""

import re


class KbertError(Exception):
    """A problem with the user's input (a path, a file, a flag) that they can fix.

    The message is one line that says what is wrong and how to fix it.
    """


class Interrupted(Exception):
    """A run stopped by SIGTERM or SIGINT after saving what it needs to resume.

    The CLI prints the message as one line and exits with `exit_code` (128 + the signal).
    """

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


def plural(n: int, word: str) -> str:
    """'1 weight', '2 weights': for messages.

    >>> plural(1, "weight"), plural(3, "weight")
    ('1 weight', '3 weights')
    """
    return f"{n} {word}{'' if n == 1 else 's'}"


def listing(names, limit: int = 8) -> str:
    """Sorted names, the first `limit` of them, then 'and N more': for one-line errors.

    >>> listing(["c", "a", "b"], limit=2)
    'a, b and 1 more'
    """
    names = sorted(names)
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


def first_line(error: BaseException, limit: int = 200) -> str:
    """An exception's first line, cut to `limit` characters (its type name if it has no text):
    what a one-line error message quotes from a library's multi-line one.

    >>> first_line(ValueError("shape mismatch\\nlong details..."))
    'shape mismatch'
    >>> first_line(KeyError())
    'KeyError'
    """
    text = str(error).strip()
    return text.splitlines()[0][:limit] if text else type(error).__name__


def op_error_text(error) -> str:
    """A TensorFlow op error's own words, whole: its first line without the `{{function_node ...}}`
    prefix and `[Op:...]` suffix that tf.function adds (which left no room for the words themselves).

    >>> op_error_text(ValueError("{{function_node __wrapped__IteratorGetNext}} corrupted record at 0 [Op:IteratorGetNext]"))
    'corrupted record at 0'
    """
    text = re.sub(r"\{\{function_node [^}]*\}\}\s*", "", first_line(error, limit=1000))
    return re.sub(r"\s*\[Op:[^\]]*\].*$", "", text).strip() or type(error).__name__
