"""The engine's shape (issue 21 §2): the server record has one writer, its own methods;
steps take what they touch (``Parts``, the record, the stop request), never the whole
``Supervisor``, so no import circle runs through it; what never changes cannot change.

The writer rule is read from the source (``ast``): the record is always reached as a
name ``record`` or an attribute ``.record`` (a parameter typed ``ServerRecord`` under
another name, or an alias of it, fails here too), and nothing but ``engine/record.py``
assigns, augments or deletes one of its attributes (or an item or attribute below one),
calls ``setattr``/``delattr`` on it, or mutates one of its containers in place.
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from sglang_supervisor.engine.parts import Learned, SchemaFacts
from sglang_supervisor.sglang.schema import load_bundled
from tests.unit.fakes import make_rig

ROOT = Path(__file__).resolve().parents[3]
ENGINE = ROOT / "supervisor" / "engine"
RECORD_MODULE = ENGINE / "record.py"
#: In-place mutators of the record's containers (its list, dict and deque fields).
MUTATORS = {
    "append",
    "appendleft",
    "extend",
    "insert",
    "remove",
    "pop",
    "popleft",
    "clear",
    "update",
    "setdefault",
    "add",
    "discard",
    "sort",
    "reverse",
}


def shown(path: Path) -> Path:
    return path.relative_to(ROOT) if path.is_relative_to(ROOT) else path


def sources() -> list[Path]:
    return sorted(p for d in (ROOT / "supervisor", ROOT / "api") for p in d.rglob("*.py"))


def is_record(node: ast.expr) -> bool:
    """``record``, or ``<anything>.record``: how every module reaches the record."""
    return (isinstance(node, ast.Name) and node.id == "record") or (
        isinstance(node, ast.Attribute) and node.attr == "record"
    )


def below_record(node: ast.expr) -> bool:
    """``node`` is an attribute or item of the record, at any depth (``record.x``,
    ``record.x[k]``, ``record.server.ready_at``)."""
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        if is_record(node.value):
            return True
        node = node.value
    return False


def targets(node: ast.AST) -> list[ast.expr]:
    if isinstance(node, ast.Assign):
        found: list[ast.expr] = []
        for t in node.targets:
            found += list(t.elts) if isinstance(t, (ast.Tuple, ast.List)) else [t]
        return found
    if isinstance(node, (ast.AugAssign, ast.AnnAssign)):
        return [node.target]
    if isinstance(node, ast.Delete):
        return list(node.targets)
    return []


def writes_outside_the_record(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    rel = shown(path)
    bad = []
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        for t in targets(node):
            if below_record(t):
                bad.append(f"{rel}:{line}: {ast.unparse(t)} is written outside record.py")
        if isinstance(node, ast.Call):
            f = node.func
            if (
                isinstance(f, ast.Name)
                and f.id in ("setattr", "delattr")
                and node.args
                and (is_record(node.args[0]) or below_record(node.args[0]))
            ):
                bad.append(f"{rel}:{line}: {f.id} on the record outside record.py")
            if isinstance(f, ast.Attribute) and f.attr in MUTATORS and below_record(f.value):
                bad.append(f"{rel}:{line}: {ast.unparse(f)}() mutates the record in place")
    return bad


def aliases_of_the_record(path: Path) -> list[str]:
    """Where the record goes by another name, the writer rule could not see it."""
    tree = ast.parse(path.read_text(), str(path))
    rel = shown(path)
    bad = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            for arg in [*a.posonlyargs, *a.args, *a.kwonlyargs]:
                note = "" if arg.annotation is None else ast.unparse(arg.annotation)
                if "ServerRecord" in note and arg.arg != "record":
                    bad.append(f"{rel}:{node.lineno}: parameter {arg.arg}: {note}")
        if isinstance(node, ast.Assign) and is_record(node.value):
            for t in node.targets:
                if not is_record(t):
                    bad.append(f"{rel}:{node.lineno}: {ast.unparse(t)} = the record")
    return bad


def test_only_the_records_own_methods_write_it() -> None:
    bad = [b for p in sources() if p != RECORD_MODULE for b in writes_outside_the_record(p)]
    assert not bad, "change the record through its methods (engine/record.py):\n" + "\n".join(bad)


def test_the_record_goes_by_one_name() -> None:
    bad = [b for p in sources() for b in aliases_of_the_record(p)]
    assert not bad, "name it `record` so the one-writer rule sees it:\n" + "\n".join(bad)


def test_the_writer_rule_catches_each_kind_of_write(tmp_path: Path) -> None:
    """The rule itself can fail: each way of writing the record from outside is caught."""
    src = tmp_path / "step.py"
    for write in (
        "record.levers = new",
        "parts, record.levers = 1, 2",
        "record.restarts += 1",
        "self.record.state: int = 3",
        "del record.server",
        "record.restarts_by_reason['crash'] = 1",
        "record.server.ready_at = 'now'",
        "setattr(record, 'levers', new)",
        "record.crash_times.append(1.0)",
        "sup.record.warnings.clear()",
    ):
        src.write_text(f"def step(record, sup, self, parts, new):\n    {write}\n")
        assert writes_outside_the_record(src), write
    src.write_text("def step(record):\n    record.commit_levers(x)\n    y = record.levers\n")
    assert not writes_outside_the_record(src)


def engine_steps() -> list[Path]:
    skip = {"__init__.py", "supervisor.py"}
    return sorted(p for p in ENGINE.glob("*.py") if p.name not in skip)


def names_the_supervisor(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    rel = shown(path)
    bad = []
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module.endswith("engine.supervisor") or any(
                a.name == "Supervisor" for a in node.names
            ):
                bad.append(f"{rel}:{line}: imports from {node.module}")
        elif isinstance(node, ast.Import) and any(
            a.name.endswith("engine.supervisor") for a in node.names
        ):
            bad.append(f"{rel}:{line}: imports the supervisor module")
        elif (isinstance(node, ast.Name) and node.id == "Supervisor") or (
            isinstance(node, ast.Attribute) and node.attr == "Supervisor"
        ):
            bad.append(f"{rel}:{line}: names Supervisor")
    return bad


def test_no_step_takes_the_whole_supervisor() -> None:
    """Only ``engine/supervisor.py`` (and the package's exports) knows ``Supervisor``:
    a step takes what it touches, and no import circle runs through the facade."""
    bad = [b for p in engine_steps() for b in names_the_supervisor(p)]
    assert not bad, "take Parts / ServerRecord / StopRequest instead:\n" + "\n".join(bad)


def test_the_import_rule_catches_a_type_checking_import(tmp_path: Path) -> None:
    src = tmp_path / "step.py"
    src.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
        "    from sglang_supervisor.engine.supervisor import Supervisor\n"
        "def step(sup: 'Supervisor') -> None: ...\n"
    )
    (tmp_path / "ok.py").write_text("from sglang_supervisor.engine.parts import Parts\n")
    assert names_the_supervisor(src)
    assert not names_the_supervisor(tmp_path / "ok.py")


def test_the_parts_never_change(tmp_path: Path) -> None:
    rig = make_rig(tmp_path)
    with pytest.raises(dataclasses.FrozenInstanceError):
        rig.sup.parts.poll_s = 1.0  # type: ignore[misc]
    learned = Learned(load_bundled())
    learned.learn(SchemaFacts(load_bundled(), live=True))
    assert learned.facts.live
    with pytest.raises(RuntimeError, match="learned once"):
        learned.learn(SchemaFacts(load_bundled()))
    assert learned.facts.live  # the first answer stands


def engine_imports(path: Path) -> set[str]:
    """The engine modules ``path`` imports (anywhere in it: a function-level import that
    hides a circle counts too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module.startswith("sglang_supervisor.engine."):
                found.add(node.module.rsplit(".", 1)[1])
            elif node.module == "sglang_supervisor.engine":
                found |= {a.name for a in node.names}
    return found


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every import circle of ``graph`` found by a depth-first walk (empty: none)."""
    found: list[list[str]] = []
    state: dict[str, int] = {}

    def walk(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                found.append([*path[path.index(nxt) :], nxt])
            elif nxt not in state:
                walk(nxt, [*path, nxt])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            walk(node, [node])
    return found


def test_the_engine_modules_import_each_other_without_a_circle() -> None:
    """The steps form layers (boundaries, parts and record at the bottom, the facade on
    top): no module imports one that imports it back, not even inside a function."""
    graph = {p.stem: engine_imports(p) for p in ENGINE.glob("*.py") if p.stem != "__init__"}
    assert not circles(graph), circles(graph)
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]
