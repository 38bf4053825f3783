import shutil
import subprocess
import sys
from pathlib import Path

from kernelbook.harness.paths import ROOT


def test_ruff_is_clean():
    ruff = shutil.which("ruff") or str(Path(sys.executable).with_name("ruff"))
    assert Path(ruff).exists(), "ruff is not installed (pip install -r requirements-dev.txt)"
    res = subprocess.run([ruff, "check", "."], cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


# (each word with one letter in brackets, so that this file does not match its own pattern)
INTERNAL = r"[i]ssue ?#?[0-9]|the [i]ssue's|lead [e]ngineer|RATIONALE[S]|still to be [w]ritten|will be [w]ritten"
PRODUCT = ["notebooks", "book", "README.md", "kernels", "kernelbook", "scripts", "tests", "solutions"]


def test_the_product_speaks_of_its_subject_not_of_how_it_is_made():
    """Readers never see the team's tracker, reviews or files, nor hear about work still to come."""
    import re

    pattern = re.compile(INTERNAL, re.IGNORECASE)
    hits = []
    for top in PRODUCT:
        paths = [ROOT / top] if (ROOT / top).is_file() else sorted((ROOT / top).rglob("*"))
        for p in paths:
            if p.is_file() and "_build" not in p.parts and p.suffix in {".md", ".ipynb", ".py", ".cu", ".cuh", ".cpp",
                                                                         ".h", ".yml", ".bib", ".txt", ".css"}:
                hits += [f"{p.relative_to(ROOT)}: {m.group(0)!r}" for m in pattern.finditer(p.read_text())]
    assert not hits, "internal wording in the product:\n" + "\n".join(hits[:20])


def test_the_toolkit_has_no_import_cycles():
    """Modules of kernelbook import each other in one direction (function-level imports included), so each
    can be read, and imported, on its own terms."""
    import ast

    pkg = ROOT / "kernelbook"
    names = {p: ".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
             for p in pkg.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for path, name in names.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                target = f"{base}.{node.module}" if node.module else base
                deps |= {f"{target}.{a.name}" for a in node.names} | {target}
        graph[name] = {d for d in deps if d in names.values() and d != name and not name.startswith(d + ".")
                       and not (path.name == "__init__.py")}

    def reaches(a: str, b: str, seen: set[str]) -> bool:
        return any(d == b or (d not in seen and not seen.add(d) and reaches(d, b, seen)) for d in graph.get(a, ()))

    cycles = sorted((a, b) for a in graph for b in graph[a] if reaches(b, a, set()))
    assert not cycles, f"import cycles between toolkit modules: {cycles}"
