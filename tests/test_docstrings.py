"""The Example blocks in docstrings run, from the repository root, and print what they say.

The one place they run: a module's own test file does not run them again."""

import doctest
import importlib
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Where each installed package's source lives (pyproject.toml's package-dir).
PACKAGE_DIRS = {"kbert": "kbert", "kbert.cli": "cli", "kbert.converters": "converters", "kbert.serving": "serving"}


def modules_with_examples() -> list:
    """Every kbert module with a `>>>` example that runs here (not +SKIP on any of its lines): a new
    one is run without being listed."""
    found = []
    for package, folder in PACKAGE_DIRS.items():
        for directory, _, files in os.walk(os.path.join(ROOT, folder)):
            for name in sorted(files):
                if not name.endswith(".py") or directory != os.path.join(ROOT, folder) and package != "kbert":
                    continue
                with open(os.path.join(directory, name), encoding="utf-8") as f:
                    examples = doctest.DocTestParser().get_examples(f.read())
                if all(example.options.get(doctest.SKIP) for example in examples):
                    continue
                relative = os.path.relpath(os.path.join(directory, name[:-3]), os.path.join(ROOT, folder))
                module = ".".join([package, *relative.split(os.sep)])
                found.append(module[: -len(".__init__")] if module.endswith(".__init__") else module)
    return sorted(found)


MODULES = modules_with_examples()


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name, monkeypatch):
    monkeypatch.chdir(ROOT)
    module = importlib.import_module(name)
    result = doctest.testmod(
        module,
        optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE,
        extraglobs={"kbert": importlib.import_module("kbert")},
    )
    assert result.failed == 0 and result.attempted > 0
