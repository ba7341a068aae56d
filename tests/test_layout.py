"""The project's shape: no import cycle between modules or between apps, each app importing
only the apps before it (nor naming a later one in a task name or a URL include), a game
that imports no Django, modules and functions of a readable size, and `docs/layout.md`
naming every module.

Every import counts, wherever it is written: at the top, inside a function, under
`if TYPE_CHECKING:` (a cycle hidden in a function is a cycle all the same). `from pkg import
name` is an import of the module `pkg.name` when there is one, else of `pkg`.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# The apps in the one order allowed: each imports only those before it.
APPS = ("studio", "rollouts", "curation", "training", "evaluation", "probes")
GAME = "rollouts.game"
TEST_SUPPORT = "studio.testing"
# The most lines a production module or function may have (docs/layout.md: "one job each").
MODULE_LINES = 500
FUNCTION_LINES = 80
# The project's wiring, which names every app by its role: the settings (installed apps, the
# beat schedule) and the root URLconf (each app's URLs mounted).
WIRING = ("studio.settings", "studio.urls")
LAYOUT_DOC = ROOT / "docs" / "layout.md"


@dataclass(frozen=True)
class Import:
    module: str  # the importing module
    file: str  # its path in the project
    line: int
    name: str  # what it imports, absolute: "django.db", "rollouts.game.drawing"
    target: str | None  # the project module that is, None outside the project

    def __str__(self) -> str:
        return f"{self.file}:{self.line} imports {self.name}"


def project_modules(root: Path, apps: Iterable[str]) -> dict[str, Path]:
    """Every module of the apps but their tests and migrations, by dotted name."""
    modules = {}
    for app in apps:
        for path in sorted((root / app).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            if "tests" in parts or "migrations" in parts:
                continue
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join(parts)] = path
    return modules


def _resolve(name: str, modules: Mapping[str, Path]) -> str | None:
    """The project module `name` is, or is in (its longest known prefix); None outside."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(module: str, root: Path, modules: Mapping[str, Path]) -> list[Import]:
    """Every import statement of the module, at any depth of its syntax tree."""
    path = modules[module]
    file = path.relative_to(root).as_posix()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the package, `level - 1` packages up
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            names = [
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                for alias in node.names
            ]
        else:
            continue
        for name in dict.fromkeys(names):
            found.append(Import(module, file, node.lineno, name, _resolve(name, modules)))
    return found


def import_graph(root: Path, apps: Iterable[str]) -> dict[str, list[Import]]:
    """Each project module and its imports (of anything)."""
    modules = project_modules(root, apps)
    return {module: imports_of(module, root, modules) for module in modules}


def cycles(edges: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in edges.get(node, ()):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                other = stack.pop()
                on_stack.discard(other)
                component.append(other)
                if other == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return sorted(found)


def module_edges(graph: Mapping[str, list[Import]]) -> dict[str, set[str]]:
    return {
        module: {i.target for i in imports if i.target and i.target != module}
        for module, imports in graph.items()
    }


def app_of(module: str) -> str:
    return module.split(".")[0]


def app_edges(graph: Mapping[str, list[Import]]) -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {}
    for module, targets in module_edges(graph).items():
        edges.setdefault(app_of(module), set()).update(
            app_of(t) for t in targets if app_of(t) != app_of(module)
        )
    return edges


def cycle_report(components: list[list[str]], graph: Mapping[str, list[Import]], of) -> str:
    """Each cycle, and the imports that close it."""
    lines = []
    for component in components:
        lines.append(" <-> ".join(component))
        members = set(component)
        for module in sorted(graph):
            if of(module) not in members:
                continue
            for i in graph[module]:
                if i.target and of(i.target) in members and of(i.target) != of(module):
                    lines.append(f"    {i}")
    return "\n".join(lines)


def later_app_imports(graph: Mapping[str, list[Import]], apps: tuple[str, ...]) -> list[Import]:
    """Imports of an app that comes after the importing module's app."""
    rank = {app: n for n, app in enumerate(apps)}
    return [
        i
        for imports in graph.values()
        for i in imports
        if i.target and rank[app_of(i.target)] > rank[app_of(i.module)]
    ]


def outside_the_game(graph: Mapping[str, list[Import]], game: str) -> list[Import]:
    """Imports by the game of Django or of a project module that is not the game's."""

    def in_game(name: str) -> bool:
        return name == game or name.startswith(game + ".")

    return [
        i
        for module, imports in graph.items()
        if in_game(module)
        for i in imports
        if i.name.split(".")[0] == "django" or (i.target and not in_game(i.target))
    ]


@dataclass(frozen=True)
class Named:
    module: str
    file: str
    line: int
    name: str  # the dotted name a string holds: "evaluation.tasks.statistics_warm"
    target: str  # the project module it names

    def __str__(self) -> str:
        return f"{self.file}:{self.line} names {self.name!r}"


def names_in_strings(root: Path, apps: Iterable[str]) -> list[Named]:
    """Every string constant that names a module of the project below an app's package: a
    Celery task's name (its module's path and its function) or a URL include. An app label
    alone (`"training.TrainingJob"`, a model Django resolves by label) names no module."""
    modules = project_modules(root, apps)
    dotted = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+")
    found = []
    for module, path in modules.items():
        file = path.relative_to(root).as_posix()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
                continue
            if not dotted.fullmatch(node.value):
                continue
            target = _resolve(node.value, modules)
            if target and "." in target:
                found.append(Named(module, file, node.lineno, node.value, target))
    return found


def later_app_names(named: Iterable[Named], apps: tuple[str, ...], wiring=()) -> list[Named]:
    """Strings of a module that name a module of an app after the module's own."""
    rank = {app: n for n, app in enumerate(apps)}
    return [
        n
        for n in named
        if n.module not in wiring and rank[app_of(n.target)] > rank[app_of(n.module)]
    ]


@dataclass(frozen=True)
class Oversized:
    file: str
    line: int
    what: str  # "module" or the function's qualified name
    lines: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line} {self.what}: {self.lines} lines"


def oversized(root: Path, apps: Iterable[str], module_lines: int, function_lines: int):
    """Production modules over `module_lines` lines and functions (methods included) over
    `function_lines`, from the `def` line to the last line of the body."""
    found = []
    for path in project_modules(root, apps).values():
        file = path.relative_to(root).as_posix()
        text = path.read_text()
        if len(text.splitlines()) > module_lines:
            found.append(Oversized(file, 1, "module", len(text.splitlines())))
        found.extend(_long_functions(ast.parse(text, filename=str(path)), file, function_lines))
    return found


def _long_functions(tree: ast.AST, file: str, limit: int, prefix: str = "") -> list[Oversized]:
    found = []
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            name = f"{prefix}{node.name}"
            if not isinstance(node, ast.ClassDef):
                lines = node.end_lineno - node.lineno + 1
                if lines > limit:
                    found.append(Oversized(file, node.lineno, f"{name}()", lines))
            found.extend(_long_functions(node, file, limit, name + "."))
        else:
            found.extend(_long_functions(node, file, limit, prefix))
    return found


def undocumented(root: Path, apps: Iterable[str], doc: str) -> list[str]:
    """The production modules and packages of the apps that `doc` does not name.

    Each app has its section (a heading naming `app/`). A module or package directly in the
    app is named anywhere in it (`views.py`, `recording/`); one deeper is named in the same
    item (a bullet or paragraph) as its package (`recording/`: ... `recorder.py`); a
    management command by its name (`rollout`). `__init__` and `apps.py` need no line."""
    sections = _sections(doc, apps)
    missing = []
    for module, path in project_modules(root, apps).items():
        app, *rest = module.split(".")
        if not rest or rest == ["apps"]:
            continue
        section = sections.get(app, "")
        if "management" in rest:
            if rest[-1] not in ("management", "commands") and f"`{rest[-1]}`" not in section:
                missing.append(module)
            continue
        leaf = rest[-1] + ("/" if path.name == "__init__.py" else ".py")
        if len(rest) == 1:
            named = _names(section, leaf)
        else:
            package = rest[-2] + "/"
            named = any(_names(item, package) and _names(item, leaf) for item in _items(section))
        if not named:
            missing.append(module)
    return sorted(missing)


def _sections(doc: str, apps: Iterable[str]) -> dict[str, str]:
    """Each app's section of the page: from its heading (`## ` and the app's folder, in
    backquotes) to the next heading."""
    found = {}
    for part in re.split(r"^## ", doc, flags=re.M)[1:]:
        for app in apps:
            if part.startswith(f"`{app}/`"):
                found[app] = part
    return found


def _items(section: str) -> list[str]:
    """A section's bullets and paragraphs."""
    return [item for item in re.split(r"\n(?=- )|\n\s*\n", section) if item.strip()]


def _names(text: str, name: str) -> bool:
    return re.search(r"(?<![\w/.])" + re.escape(name) + r"(?![\w])", text) is not None


@pytest.fixture(scope="module")
def graph() -> dict[str, list[Import]]:
    return import_graph(ROOT, APPS)


# --- the project -------------------------------------------------------------------------


def test_no_module_is_in_an_import_cycle(graph):
    found = cycles(module_edges(graph))
    assert not found, "import cycles between modules:\n" + cycle_report(found, graph, lambda m: m)


def test_each_app_imports_only_the_apps_before_it(graph):
    offending = later_app_imports(graph, APPS)
    assert not offending, f"the order is {' < '.join(APPS)}; these import a later app:\n" + (
        "\n".join(f"    {i}" for i in offending)
    )


def test_no_app_is_in_an_import_cycle(graph):
    found = cycles(app_edges(graph))
    assert not found, "import cycles between apps:\n" + cycle_report(found, graph, app_of)


def test_the_game_imports_no_django_and_no_project_module_outside_it(graph):
    assert any(m.startswith(GAME + ".") for m in graph), "no game modules found"
    offending = outside_the_game(graph, GAME)
    assert not offending, "\n".join(f"    {i}" for i in offending)


def test_the_game_imports_no_django_when_run(graph):
    """What its imports import counts too: the game's modules, imported in a fresh Python."""
    game = sorted(m for m in graph if m.startswith(GAME + "."))
    code = (
        "import importlib, json, sys\n"
        f"for name in {game!r}: importlib.import_module(name)\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    loaded = json.loads(done.stdout.strip().splitlines()[-1])
    assert GAME in loaded and set(game) <= set(loaded)  # the check saw the game
    assert not [m for m in loaded if m == "django" or m.startswith("django.")]
    project = [m for m in loaded if app_of(m) in APPS]
    assert not [m for m in project if m != "rollouts" and not m.startswith(GAME)], project


def test_no_production_module_imports_the_test_support(graph):
    offending = [i for imports in graph.values() for i in imports if i.target == TEST_SUPPORT]
    assert not offending, "\n".join(f"    {i}" for i in offending)


def test_no_app_names_a_later_app_in_a_task_name_or_a_url_include():
    offending = later_app_names(names_in_strings(ROOT, APPS), APPS, WIRING)
    assert not offending, f"the order is {' < '.join(APPS)}; these name a later app:\n" + (
        "\n".join(f"    {n}" for n in offending)
    )


def test_no_production_module_or_function_is_too_long_to_read():
    found = oversized(ROOT, APPS, MODULE_LINES, FUNCTION_LINES)
    assert not found, (
        f"modules over {MODULE_LINES} lines, functions over {FUNCTION_LINES}: split them\n"
        + "\n".join(f"    {o}" for o in found)
    )


def test_docs_layout_names_every_app_and_every_module():
    doc = LAYOUT_DOC.read_text()
    assert all(f"## `{app}/`" in doc for app in APPS), "docs/layout.md: a section per app"
    missing = undocumented(ROOT, APPS, doc)
    assert not missing, "docs/layout.md does not name these modules:\n" + "\n".join(
        f"    {m}" for m in missing
    )


# --- the checks themselves, on a project made up for them --------------------------------


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_the_walk_finds_cycles_hidden_in_functions_type_checking_and_submodules(tmp_path):
    _write(
        tmp_path,
        {
            "first/__init__.py": "",
            "first/services.py": "def run():\n    from first import tasks\n",
            "first/tasks.py": "from first.services import run\n",
            "first/game/__init__.py": "",
            "first/game/rules.py": (
                "from typing import TYPE_CHECKING\n"
                "if TYPE_CHECKING:\n    from first.game import board\n"
            ),
            "first/game/board.py": "from . import rules\nimport django.db\n",
            "first/game/pure.py": "from first.game.rules import x\n",
            "first/tests/test_it.py": "import second.views\n",
            "first/migrations/0001.py": "import second.views\n",
            "second/__init__.py": "",
            "second/views.py": "import first.services\n",
            "second/late.py": "",
            "first/uses_late.py": "def f():\n    from second import late\n",
        },
    )
    graph = import_graph(tmp_path, ("first", "second"))
    assert "first.tests.test_it" not in graph and "first.migrations.0001" not in graph
    assert cycles(module_edges(graph)) == [
        ["first.game.board", "first.game.rules"],
        ["first.services", "first.tasks"],
    ]
    assert cycles(app_edges(graph)) == [["first", "second"]]
    late = later_app_imports(graph, ("first", "second"))
    assert [(i.module, i.line, i.target) for i in late] == [("first.uses_late", 2, "second.late")]
    assert str(late[0]) == "first/uses_late.py:2 imports second.late"
    outside = outside_the_game(graph, "first.game")
    assert [(i.module, i.name) for i in outside] == [("first.game.board", "django.db")]
    _write(tmp_path, {"first/game/pure.py": "from first import services\n"})
    outside = outside_the_game(import_graph(tmp_path, ("first", "second")), "first.game")
    assert [(i.module, i.target) for i in outside] == [
        ("first.game.board", None),
        ("first.game.pure", "first.services"),
    ]


def test_the_string_size_and_doc_checks_find_what_they_look_for(tmp_path):
    _write(
        tmp_path,
        {
            "first/__init__.py": "",
            "first/apps.py": "",
            "first/services.py": (
                'TASK = "second.tasks.warm"\nMODEL = "second.Thing"\n'
                "def long():\n" + "    x = 1\n" * 80
            ),
            "first/urls.py": 'include("second.urls")\n',
            "first/play/__init__.py": "",
            "first/play/forks.py": "class A:\n    def f(self):\n" + "        y = 2\n" * 80,
            "first/management/commands/go.py": "",
            "first/tests/test_it.py": "x = 1\n" * 600,
            "second/__init__.py": "",
            "second/tasks.py": 'NAME = "first.services"\n',
            "second/urls.py": "",
            "second/big.py": "z = 3\n" * 501,
        },
    )
    apps = ("first", "second")
    late = later_app_names(names_in_strings(tmp_path, apps), apps)
    assert [str(n) for n in late] == [
        "first/services.py:1 names 'second.tasks.warm'",
        "first/urls.py:1 names 'second.urls'",
    ]
    assert later_app_names(names_in_strings(tmp_path, apps), apps, ("first.services",)) == [late[1]]
    found = oversized(tmp_path, apps, 500, 80)
    assert sorted(str(o) for o in found) == [
        "first/play/forks.py:2 A.f(): 81 lines",
        "first/services.py:3 long(): 81 lines",
        "second/big.py:1 module: 501 lines",
    ]
    doc = (
        "# Layout\n\n## `first/`: one\n\n- `services.py`, `urls.py`, the command `go`\n"
        "- `play/`: `forks.py`\n\n## `second/`: two\n\n`tasks.py`, `urls.py`, `big.py`, "
        "and `forks.py`\n"
    )
    assert undocumented(tmp_path, apps, doc) == []
    doc = doc.replace("- `play/`: `forks.py`\n", "- `play/`\n").replace("`go`", "go")
    assert undocumented(tmp_path, apps, doc) == [
        "first.management.commands.go",
        "first.play.forks",
    ]
