"""The house rules of docs/architecture.md, read from the source: commands are a thin layer
that only the CLI imports, no import cycles between packages or inside one, imports inside
functions only for optional dependencies, and short command modules."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "vitkit"

# Third-party modules that are optional (an extra, or a platform's) and so may be imported
# where they are needed; anything else is imported at the top of its module.
OPTIONAL = {"matplotlib", "torchvision", "fastapi", "uvicorn", "starlette", "multipart",
            "python_multipart", "tensorboard", "torch.utils.tensorboard", "resource", "timm",
            "transformers", "open_clip", "huggingface_hub", "jax", "flax", "sklearn", "scipy",
            "onnx", "onnxruntime", "peft"}


# Modules that import some of their own package late, on purpose, and why (the one exception
# to "imports at the top"; docs/architecture.md says it too).
DEFERRED = {
    "vitkit.diagnose": ("the doctor answers a run folder or a vitkit .safetensors in under 3 s "
                        "without torch, whose import alone takes 3 s on a 2-core machine; the "
                        "checks that need a model or maps are imported when asked for"),
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _resolve(module: str, name: str | None) -> str:
    """``from module import name`` -> the vitkit module it loads (a submodule when it is one)."""
    if name and (SRC.parent / (module + "." + name).replace(".", "/")).with_suffix(".py").exists():
        return f"{module}.{name}"
    if name and (SRC.parent / (module + "." + name).replace(".", "/") / "__init__.py").exists():
        return f"{module}.{name}"
    return module


def _imports(path: Path) -> list[tuple[str, bool, list[str]]]:
    """(imported module, inside a function?, names) for every import in ``path``."""
    tree = ast.parse(path.read_text())
    out = []

    def visit(node, nested):
        for child in ast.iter_child_nodes(node):
            inner = nested or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            if isinstance(child, ast.Import):
                out.extend((a.name, inner, []) for a in child.names)
            elif isinstance(child, ast.ImportFrom) and child.module and child.level == 0:
                if child.module.startswith("vitkit"):
                    out.extend((_resolve(child.module, a.name), inner, [a.name])
                               for a in child.names)
                else:
                    out.append((child.module, inner, [a.name for a in child.names]))
            visit(child, inner)

    visit(tree, False)
    return out


MODULES = {_module_name(p): p for p in sorted(SRC.rglob("*.py"))}
IMPORTS = {name: _imports(path) for name, path in MODULES.items()}


def _package(module: str) -> str:
    """vitkit.train.study -> vitkit.train; a top-level module (vitkit.recipe) is its own."""
    parts = module.split(".")
    return ".".join(parts[:2])


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def dfs(node):
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := dfs(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := dfs(node)):
            return found
    return None


def test_only_the_cli_imports_the_commands():
    for module, imports in IMPORTS.items():
        for target, _, names in imports:
            if not target.startswith("vitkit.commands"):
                continue
            if module.startswith("vitkit.commands"):
                # a command may use the shared argument types and the registry, nothing of
                # another command (no private names, no library code living in a command)
                assert target in ("vitkit.commands.options", "vitkit.commands.conversion",
                                  "vitkit.commands"), (
                    f"{module} imports {target}: move what it needs into the library")
                assert not any(n.startswith("_") for n in names), (module, target, names)
            else:
                assert module == "vitkit.cli", f"{module} imports {target}: library code " \
                    "must not depend on the command layer"


def test_the_benchmarks_import_only_the_library():
    for script in sorted((ROOT / "benchmarks").glob("*.py")):
        for target, _, _ in _imports(script):
            assert not target.startswith("vitkit.commands"), f"{script.name} imports {target}"


def test_no_import_cycle_between_packages():
    graph: dict[str, set[str]] = {}
    for module, imports in IMPORTS.items():
        for target, _, _ in imports:
            if target.startswith("vitkit.") and _package(target) != _package(module):
                graph.setdefault(_package(module), set()).add(_package(target))
    assert _cycle(graph) is None, f"packages import each other: {' -> '.join(_cycle(graph))}"


def _declared_layers() -> dict[str, set[str]]:
    """docs/architecture.md's table: package -> the packages it may import."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    rows = text[text.index("| package | imports from |"):].splitlines()[2:]
    layers = {}
    for row in rows:
        if not row.startswith("|"):
            break
        cells = row.split("|")
        for name in (n.strip("` ") for n in cells[1].split(",")):
            layers[f"vitkit.{name}"] = {f"vitkit.{t.strip('` ')}" for t in cells[2].split(",")
                                        if t.strip().startswith("`")}
    return layers


def test_the_packages_import_only_what_the_architecture_page_says():
    layers = _declared_layers()
    for module, imports in IMPORTS.items():
        package = _package(module)
        if package == "vitkit":
            continue  # vitkit/__init__.py gathers the public names
        assert package in layers, f"{package} is not in docs/architecture.md's layer table"
        for target, _, _ in imports:
            other = _package(target)
            if target.startswith("vitkit.") and other != package:
                assert other in layers[package], (
                    f"{module} imports {target}, but docs/architecture.md says {package} "
                    f"imports only from {sorted(layers[package])}")


def test_no_import_cycle_inside_a_package():
    graph: dict[str, set[str]] = {}
    for module, imports in IMPORTS.items():
        for target, _, _ in imports:
            if target in MODULES and _package(target) == _package(module) and target != module:
                if MODULES[module].name == "__init__.py" and target.startswith(module + "."):
                    continue  # a package's __init__ gathering its own modules
                graph.setdefault(module, set()).add(target)
    assert _cycle(graph) is None, f"modules import each other: {' -> '.join(_cycle(graph))}"


def _optional(target: str) -> bool:
    return target in OPTIONAL or target.split(".")[0] in OPTIONAL


def _needs_an_extra() -> set[str]:
    """vitkit modules that cannot be imported without an optional dependency (they import one
    at their top, or such a vitkit module): importing them late is importing it late."""
    needs = {m for m, imports in IMPORTS.items()
             if any(not nested and _optional(t) for t, nested, _ in imports)}
    while True:
        more = {m for m, imports in IMPORTS.items() if m not in needs
                and any(not nested and t in needs for t, nested, _ in imports)}
        if not more:
            return needs
        needs |= more


def test_imports_inside_functions_are_only_for_optional_dependencies():
    extra = _needs_an_extra()
    found = [(module, target) for module, imports in IMPORTS.items()
             for target, nested, _ in imports
             if nested and not _optional(target) and target not in extra
             and not (module in DEFERRED and target.startswith(module + "."))]
    assert not found, "import these at the top of the module: " + ", ".join(
        f"{t} in {m}" for m, t in found)


def test_the_doctor_starts_without_torch(tmp_path):
    """What DEFERRED buys: `vitkit doctor` on a run folder, a vitkit .safetensors or an audit
    folder never imports torch (checked in a fresh interpreter)."""
    import subprocess
    import sys

    import vitkit

    run = ROOT / "tests" / "data" / "doctor" / "short"
    model = tmp_path / "m.safetensors"
    vitkit.save_model(vitkit.create_model("vit_nano_patch4_32"), model)
    audit = ROOT / "examples" / "audit-shortcut" / "marked"
    for target in (run, model, audit):
        code = (f"import sys; from vitkit.cli import main; code = main(['doctor', "
                f"{str(target)!r}]); sys.exit(3 if 'torch' in sys.modules else code)")
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        assert done.returncode in (0, 1), (target, done.returncode, done.stderr[-2000:])


@pytest.mark.parametrize("path", sorted((SRC / "commands").glob("*.py")), ids=lambda p: p.name)
def test_every_command_module_is_short(path):
    """A command parses, calls the library and prints: about 120 lines at most."""
    lines = len(path.read_text().splitlines())
    assert lines <= 125, f"{path.name} has {lines} lines; move its library code out"


def test_the_rules_would_catch_a_cycle():
    """The cycle finder itself: a planted cycle is found, a tree is not."""
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b", "c"}, "b": {"c"}}) is None


def _prints(tree: ast.AST) -> list[int]:
    """Lines that use ``print`` (a call, or passed as a default), outside an
    ``if __name__ == "__main__":`` block (a module's own entry point may print)."""
    found = []

    def walk(node: ast.AST) -> None:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Compare) and \
                isinstance(node.test.left, ast.Name) and node.test.left.id == "__name__":
            return
        if isinstance(node, ast.Name) and node.id == "print":
            found.append(node.lineno)
        for child in ast.iter_child_nodes(node):
            walk(child)

    walk(tree)
    return found


def test_library_packages_never_print():
    """docs/architecture.md: only `cli` and `commands` print; the library logs (the `vitkit`
    logger, which the command line shows on stderr) or returns what it found."""
    printing = {name: _prints(ast.parse(path.read_text())) for name, path in MODULES.items()
                if not name.startswith(("vitkit.cli", "vitkit.__main__", "vitkit.commands"))}
    offenders = {name: lines for name, lines in printing.items() if lines}
    assert not offenders, f"library modules that print (log instead): {offenders}"
