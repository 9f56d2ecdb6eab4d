"""The house rules a contributor relies on: small modules and functions, imports that
point one way without circles, a README layout that matches the tree, documentation
that stands on its own (no pointers outside the repository, no broken links)."""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("gaca_agent", "gaca_envs")
MAX_FILE_LINES = 400
MAX_FUNCTION_LINES = 60


def sources() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_no_module_over_the_line_limit():
    long = {str(p.relative_to(ROOT)): n for p in sources()
            if (n := len(p.read_text().splitlines())) > MAX_FILE_LINES}
    assert not long, f"modules over {MAX_FILE_LINES} lines: {long}"


def long_functions(paths: list[Path], limit: int) -> list[str]:
    long = []
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > limit:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({length})")
    return long


def test_no_function_over_the_line_limit():
    long = long_functions(sources(), MAX_FUNCTION_LINES)
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines: {long}"


def test_the_training_loop_reads_in_short_functions():
    """One iteration on one screen: training/'s functions stay within 50 lines."""
    long = long_functions(sorted((ROOT / "gaca_agent" / "training").glob("*.py")), 50)
    assert not long, f"training functions over 50 lines: {long}"


def import_graph() -> dict[str, set[str]]:
    """Module -> the project modules it imports (at module level or inside functions)."""
    modules = {module_name(p): p for p in sources()}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1]
                                    + ([base] if base else []))
                # `from pkg import mod` imports the module pkg.mod; else pkg itself
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                           for a in node.names]
            else:
                continue
            edges.update(t for t in targets if t in modules and t != name)
        graph[name] = edges
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_circle():
    assert cycles(import_graph()) == []


#: gaca_agent's packages from the bottom up: a module imports only from its own layer or
#: below (docs/architecture.md, "Layers").
LAYERS = (("advantages", "types"), ("steps", "learner"), ("generate",),
          ("policies", "serving", "runs"), ("collect",), ("cluster", "eval"), ("config",),
          ("analysis", "training"), ("integrations", "view"), ("cli",))


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Edges of ``graph`` from a gaca_agent package to one in a higher layer."""
    layer = {pkg: i for i, pkgs in enumerate(LAYERS) for pkg in pkgs}

    def level(module: str) -> int | None:
        parts = module.split(".")
        return layer.get(parts[1]) if parts[0] == "gaca_agent" and len(parts) > 1 else None

    return sorted(f"{a} -> {b}" for a, targets in graph.items() for b in targets
                  if level(a) is not None and level(b) is not None and level(b) > level(a))


def test_no_import_goes_up_a_layer():
    graph = import_graph()
    packages = {m.split(".")[1] for m in graph if m.startswith("gaca_agent.")
                and m.count(".") >= 1 and not m.endswith("__init__")}
    placed = {pkg for pkgs in LAYERS for pkg in pkgs}
    assert packages - {"__init__"} <= placed, f"packages with no layer: {packages - placed}"
    assert upward_imports(graph) == []


def test_the_layer_check_sees_an_upward_import():
    assert upward_imports({"gaca_agent.collect.pools": {"gaca_agent.cluster.ray_pool"},
                           "gaca_agent.cluster.ray_pool": {"gaca_agent.collect.workers"}}) \
        == ["gaca_agent.collect.pools -> gaca_agent.cluster.ray_pool"]


def test_cycle_finder_sees_a_circle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_environments_do_not_name_the_agent():
    naming = [str(p.relative_to(ROOT)) for p in (ROOT / "gaca_envs").rglob("*")
              if p.is_file() and p.suffix in (".py", ".txt", ".json", ".yaml")
              and "gaca_agent" in p.read_text(errors="ignore")]
    assert not naming, f"gaca_envs files that name gaca_agent: {naming}"


def test_ray_is_imported_in_one_package():
    outside = [str(p.relative_to(ROOT)) for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")
               if re.search(r"^\s*(import ray|from ray)\b", p.read_text(), re.M)
               and "gaca_agent/cluster/" not in str(p.relative_to(ROOT))]
    assert not outside, f"modules importing ray outside gaca_agent/cluster/: {outside}"


def readme_layout() -> list[str]:
    """The paths of the README's layout block (first word of each line)."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## Layout", 1)[1]
    block = section.split("```", 2)[1]
    return [line.split()[0] for line in block.strip("\n").splitlines() if line.strip()]


def test_readme_layout_matches_the_tree():
    listed = readme_layout()
    missing = [p for p in listed if not (ROOT / p).exists()]
    assert not missing, f"the README's layout lists paths that do not exist: {missing}"
    folders = {str(p.parent.relative_to(ROOT)) + "/" for pkg in PACKAGES
               for p in (ROOT / pkg).rglob("__init__.py")}
    folders |= {"gaca_agent/configs/", "benchmarks/", "docs/", "tests/"}
    unlisted = sorted(folders - set(listed) - {f"{pkg}/" for pkg in PACKAGES
                                                if f"{pkg}/" in listed})
    assert not unlisted, f"package folders missing from the README's layout: {unlisted}"


def markdown_files() -> list[Path]:
    return [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]


def anchors(path: Path) -> set[str]:
    """The heading anchors of a markdown file, as mkdocs and GitHub spell them."""
    out = set()
    for line in path.read_text().splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            out.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return out


def test_documentation_links_resolve():
    broken = []
    for md in markdown_files():
        for target in re.findall(r"\]\(([^)\s]+)\)", md.read_text()):
            if re.match(r"^[a-z]+:", target) or target.startswith("#"):
                continue
            file, _, anchor = target.partition("#")
            dest = (md.parent / file).resolve()
            if not dest.exists() or (anchor and dest.suffix == ".md"
                                     and anchor not in anchors(dest)):
                broken.append(f"{md.relative_to(ROOT)} -> {target}")
    assert not broken, f"broken links: {broken}"


def test_nothing_points_outside_the_repository_for_documentation():
    pattern = re.compile(r"\.\./shared|ALGORITHMS\.md|SPEC\.md|STYLE\.md|PUBLISHED\.md")
    files = [*markdown_files(), *sources(), *(ROOT / "benchmarks").glob("*.py"),
             *(ROOT / "gaca_agent" / "configs").rglob("*.yaml")]
    pointing = [str(p.relative_to(ROOT)) for p in files if pattern.search(p.read_text())]
    assert not pointing, f"files pointing outside the repository: {pointing}"


def test_documentation_site_builds_strictly(tmp_path):
    if shutil.which("mkdocs") is None and not (Path(sys.executable).parent / "mkdocs").exists():
        pytest.skip("mkdocs is not installed (pip install -e '.[docs]')")
    mkdocs = shutil.which("mkdocs") or str(Path(sys.executable).parent / "mkdocs")
    run = subprocess.run([mkdocs, "build", "--strict", "-q", "-d", str(tmp_path / "site")],
                         cwd=ROOT, capture_output=True, text=True,
                         env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"})
    assert run.returncode == 0, run.stdout + run.stderr
