"""The tree keeps the shape docs/architecture.md describes (issue 21 §1, §4).

- nothing imports the source directories' names (``supervisor``, ``api``): they are
  installed as ``sglang_supervisor`` and ``sglang_supervisor_api``, and an import of the
  old name would pick up PyPI's Supervisord or any package called ``api``;
- the core never imports the API layer;
- no module is over 400 lines;
- docs/architecture.md names every module, every module, path and name it cites exists,
  and pyproject.toml lists every package.
"""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CORE, API = ROOT / "supervisor", ROOT / "api"
MAX_LINES = 400


def python_files() -> list[Path]:
    dirs = [CORE, API, ROOT / "tests", ROOT / "scripts"]
    return sorted(p for d in dirs for p in d.rglob("*.py") if "results" not in p.parts)


def imported(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
    return names


def modules(base: Path, prefix: str) -> dict[str, Path]:
    out = {}
    for p in sorted(base.rglob("*.py")):
        rel = p.relative_to(base).with_suffix("")
        parts = [prefix, *rel.parts]
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = p
    return out


def test_nothing_imports_the_directory_names() -> None:
    bad = [
        f"{p.relative_to(ROOT)}: import {name}"
        for p in python_files()
        for name in imported(p)
        if name.split(".")[0] in ("supervisor", "api")
    ]
    assert not bad, "import sglang_supervisor / sglang_supervisor_api instead:\n" + "\n".join(bad)


def test_the_core_never_imports_the_api() -> None:
    bad = [
        f"{p.relative_to(ROOT)}: import {name}"
        for p in CORE.rglob("*.py")
        for name in imported(p)
        if name.split(".")[0] == "sglang_supervisor_api"
    ]
    assert not bad, "\n".join(bad)


#: What each package of the core may import at run time (``typing.TYPE_CHECKING`` imports
#: are exempt), as each package's ``__init__`` docstring says. "top": the modules at the top
#: level of ``supervisor/``, the vocabulary.
MAY_IMPORT = {
    "top": {"top"},
    "sglang": {"top"},
    "planner": {"top", "sglang"},
    "host": {"top", "sglang", "planner"},
    "observe": {"top", "host"},
    "sim": {"top", "sglang", "planner", "host"},
    "engine": {"top", "sglang", "host", "observe", "planner", "slurm"},
    "slurm": {"top", "host", "sim"},
}
#: Top-level modules beyond the vocabulary's rule: store keeps sglang's lever sets; config
#: reads the ``[slurm]`` table; runtime is the composition root.
TOP_EXCEPTIONS = {"store": {"sglang"}, "config": {"slurm"}, "runtime": set(MAY_IMPORT)}


def package_of(dotted: str) -> str:
    parts = dotted.split(".")
    return parts[1] if len(parts) >= 2 and parts[1] in MAY_IMPORT else "top"


def runtime_imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    type_only = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for inner in ast.walk(node)
    }
    names = []
    for node in ast.walk(tree):
        if id(node) in type_only or not isinstance(node, ast.ImportFrom) or not node.module:
            continue
        if node.module.split(".")[0] != "sglang_supervisor":
            continue
        if node.module.count(".") == 0 or node.module.split(".")[-1] in MAY_IMPORT:
            names += [f"{node.module}.{a.name}" for a in node.names]  # a module or a name
        else:
            names.append(node.module)
    return names


def test_each_package_imports_only_what_its_docstring_allows() -> None:
    bad = []
    for name, path in modules(CORE, "sglang_supervisor").items():
        me = package_of(name)
        allowed = MAY_IMPORT[me] | {me}
        if me == "top":
            allowed = allowed | TOP_EXCEPTIONS.get(name.split(".")[-1], set())
        for target in runtime_imports(path):
            if package_of(target) not in allowed:
                bad.append(f"{path.relative_to(ROOT)} ({me}) imports {target}")
    assert not bad, "see docs/architecture.md, Packages by concern:\n" + "\n".join(bad)


def test_no_module_over_400_lines() -> None:
    long = {
        str(p.relative_to(ROOT)): n
        for p in [*CORE.rglob("*.py"), *API.rglob("*.py")]
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert not long, f"split these (over {MAX_LINES} lines): {long}"


def test_architecture_doc_names_every_module() -> None:
    doc = (ROOT / "docs/architecture.md").read_text()
    found = {**modules(CORE, "supervisor"), **modules(API, "api")}
    missing = [
        str(p.relative_to(ROOT))
        for p in found.values()
        if p.name != "__init__.py" and str(p.relative_to(ROOT)) not in doc
    ]
    assert not missing, "docs/architecture.md does not name: " + ", ".join(missing)


def test_every_package_is_installed() -> None:
    setup = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(setup["packages"])
    packages = {
        name.replace("supervisor", "sglang_supervisor", 1)
        if name.startswith("supervisor")
        else name.replace("api", "sglang_supervisor_api", 1)
        for name, p in {**modules(CORE, "supervisor"), **modules(API, "api")}.items()
        if p.name == "__init__.py"
    }
    assert packages == listed, (
        f"pyproject.toml [tool.setuptools] packages: add {sorted(packages - listed)}, "
        f"remove {sorted(listed - packages)}"
    )


def test_every_package_says_what_it_holds() -> None:
    for p in [*CORE.rglob("__init__.py"), *API.rglob("__init__.py")]:
        doc = ast.get_docstring(ast.parse(p.read_text()))
        assert doc, f"{p.relative_to(ROOT)}: say what the package holds"


#: Paths docs/architecture.md cites in SGLang's own tree (not this repository's).
SGLANG_PATHS = {"arg_groups/memory_hook.py", "sglang/srt/"}


def _code_names() -> tuple[set[str], set[str]]:
    """Every name the code defines or uses (functions, classes, variables, attributes,
    arguments, imports, modules), and every string constant in it."""
    names: set[str] = set()
    strings: set[str] = set()
    for prefix, base in (("sglang_supervisor", CORE), ("sglang_supervisor_api", API)):
        for dotted, path in modules(base, prefix).items():
            parts = dotted.split(".")
            names.update(".".join(parts[i:]) for i in range(len(parts)))  # engine.release
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    names.add(node.name)
                elif isinstance(node, ast.Name):
                    names.add(node.id)
                elif isinstance(node, ast.Attribute):
                    names.add(node.attr)
                elif isinstance(node, (ast.arg, ast.keyword)) and node.arg:
                    names.add(node.arg)
                elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                    strings.add(node.value)
    # The alerts it names live in the shipped rules.
    rules = (ROOT / "deploy/prometheus/alerts.yml").read_text()
    names.update(re.findall(r"alert:\s*(\w+)", rules))
    return names, strings


def test_everything_the_architecture_doc_cites_exists() -> None:
    """Every `code` span of docs/architecture.md that is a path (``x.py``, ``dir/``) names a
    file or directory of the tree, and every one that is a Python name (``stop_and_release``,
    ``Parts``, ``engine.release``, ``release_timeout(...)``) is defined or used in the code
    (issue 27 §8: the page is the map a change starts from; a renamed function left it
    pointing nowhere)."""
    doc = (ROOT / "docs/architecture.md").read_text()
    cited = {span.strip("`") for span in re.findall(r"`([^`\n]+)`", doc)}
    files = [p.relative_to(ROOT).as_posix() for d in (CORE, API) for p in d.rglob("*")]
    names, strings = _code_names()
    missing = []
    for span in sorted(cited):
        if re.fullmatch(r"[\w.-]+(/[\w.-]+)*(\.py|/)", span):
            rel = span.rstrip("/")
            found = (ROOT / rel).exists() or any(f == rel or f.endswith("/" + rel) for f in files)
            if not found and span not in SGLANG_PATHS:
                missing.append(f"path {span}")
        elif m := re.fullmatch(r"([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)(\(.*\))?", span):
            name = m.group(1)
            if name.rsplit(".", 1)[-1] in ("py", "json", "toml", "md", "log", "jsonl"):
                continue  # a file name (state.json)
            last = name.rsplit(".", 1)[-1]
            known = name in names or last in names or name in strings
            if not known and not any(s.endswith("_" + name) for s in strings):
                missing.append(f"name {span}")
    assert not missing, "docs/architecture.md cites what the code lacks: " + ", ".join(missing)


def test_the_repository_cites_nothing_outside_it() -> None:
    """Docs, code and results cited a design file and a folder that are not in the
    repository (issue 27 §8): the design the code follows is docs/design.md. (The names
    are assembled here so that this file cites nothing outside either.)"""
    names = ["DESIGN" + r"\.md", "/work/" + "shared", r"\.\./" + "shared"]
    outside = re.compile("|".join(names))
    tops = ["README.md", "docs", "supervisor", "api", "tests", "scripts", "deploy", "systemd"]
    bad = []
    for top in tops:
        paths = [ROOT / top] if (ROOT / top).is_file() else sorted((ROOT / top).rglob("*"))
        for path in paths:
            if path.suffix not in (".py", ".md", ".toml", ".sh", ".yml", ".yaml", ".service"):
                continue
            if "__pycache__" in path.parts:
                continue
            for n, line in enumerate(path.read_text().splitlines(), 1):
                if outside.search(line):
                    bad.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()[:80]}")
    assert not bad, "\n".join(bad)
