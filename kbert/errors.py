"""The one exception type for user errors: the CLI prints its message as one line and exits 1."""


class KbertError(Exception):
    """A problem with the user's input (a path, a file, a flag) that they can fix.

    The message is one line that says what is wrong and how to fix it.
    """
