"""Functions stay short enough to read at once: one over `LONGEST` lines (its docstring left out)
in kbert/, serving/, converters/ or cli/ says why beside its def, as `# long: <reason>` on the
def line or the line above it (above its decorators, for a decorated one)."""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
FOLDERS = ("kbert", "serving", "converters", "cli")
LONGEST = 80
REASON = "# long: "


def length(function: ast.FunctionDef) -> int:
    """Lines from the def to the function's end, its docstring left out."""
    lines = function.end_lineno - function.lineno + 1
    first = function.body[0]
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        lines -= first.end_lineno - first.lineno + 1
    return lines


def says_why(function: ast.FunctionDef, lines: list) -> bool:
    """A `# long: ` reason on the def line, or on the line above the def (or its first decorator)."""
    top = min([function.lineno] + [d.lineno for d in function.decorator_list])
    candidates = [lines[function.lineno - 1], lines[top - 2] if top > 1 else ""]
    return any(REASON in line and line.split(REASON, 1)[1].strip() for line in candidates)


def long_functions(source: str):
    """(name, line, length, has a reason) of each function in `source` over LONGEST lines."""
    lines = source.splitlines()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and length(node) > LONGEST:
            yield node.name, node.lineno, length(node), says_why(node, lines)


def test_long_functions_are_found_and_their_reasons_read():
    body = "\n".join(f"    x = {i}" for i in range(LONGEST))
    fits = "\n".join(f"    x = {i}" for i in range(LONGEST - 1))  # with its def: LONGEST lines
    source = (
        f'def short():\n    """{"doc " * 5}\n\n    more doc\n    """\n{fits}\n\n'
        f"def plain():\n{body}\n    return x\n\n"
        f"# long: one table, row by row\n@staticmethod\ndef decorated():\n{body}\n    return x\n\n"
        f"def inline():  # long: the original's steps, in its order\n{body}\n    return x\n\n"
        f"# long:\ndef empty_reason():\n{body}\n    return x\n"
    )
    found = {name: said for name, _, _, said in long_functions(source)}
    assert found == {"plain": False, "decorated": True, "inline": True, "empty_reason": False}


@pytest.mark.parametrize("folder", FOLDERS)
def test_functions_over_the_limit_say_why(folder):
    unexplained = [
        f"{path.relative_to(ROOT)}:{line} {name} ({lines} lines)"
        for path in sorted((ROOT / folder).rglob("*.py"))
        for name, line, lines, said in long_functions(path.read_text(encoding="utf-8"))
        if not said
    ]
    assert not unexplained, (
        f"functions over {LONGEST} lines: split them into named steps, or write `{REASON}<reason>` "
        f"beside the def: {unexplained}"
    )
