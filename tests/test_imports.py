"""The package's layers import one way (docs/platform.md): memory → layers → models → lit / data → sweep / eval → cli.

A module may import from its own layer or any layer to its left, never from one to its right. Every module of
``atlas_lab`` is parsed (not imported) and each of its imports of ``atlas_lab`` is resolved, relative ones and
those deferred inside functions included, to the module it names; an import whose module sits in a layer of a
higher rank than the importer's is reported with the importer, the line, the import and both layers.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "atlas_lab"

# Each subpackage and top-level module of atlas_lab, by rank. The top-level helpers sit at the lowest rank their own
# imports allow: none of store, tables and noise imports anything of atlas_lab (store must sit below lit: a fit's
# logger and the sweep both set up the tracking store through it).
RANKS = {
    "memory": 0,  # memory.ops included
    "__init__": 0,  # atlas_lab itself (the version)
    "store": 0,
    "tables": 0,
    "noise": 0,
    "exports": 0,  # the names of data, eval and sweep imported when first used
    "layers": 1,
    "models": 2,
    "configfiles": 2,  # the run's -c files and model values (ModelConfig), checked before Lightning is imported
    "lit": 3,
    "data": 3,
    "sweep": 4,
    "eval": 4,  # evaluates checkpoints of lit's model on data's tokenizers; logs to MLflow as sweep does
    "cli": 5,  # atlas_lab/cli.py, the command
}


def package_modules(root: Path = PACKAGE) -> dict[str, tuple[Path, bool]]:
    """{dotted module name: (file, is a package)} for every .py file under the package root."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = [root.name, *path.relative_to(root).with_suffix("").parts]
        is_package = parts[-1] == "__init__"
        out[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return out


def layer(module: str) -> str:
    """The layer of a module of atlas_lab: its subpackage or top-level module (``__init__`` for the package)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def imported_modules(module: str, is_package: bool, source: str, known: set[str], top: str = "atlas_lab"):
    """(line, import as written, module it names) for every import of the package ``top`` in ``source``, at any
    depth (inside functions, classes, conditionals), relative ones resolved against ``module``. ``from X import
    name`` names the submodule X.name where there is one, else X; ``importlib.import_module("...")`` with a
    constant name counts too."""
    tree = ast.parse(source)
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == top or alias.name.startswith(top + "."):
                    yield node.lineno, f"import {alias.name}", alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not (target == top or target.startswith(top + ".")):
                continue
            written = f"from {'.' * node.level}{node.module or ''} import "
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                yield node.lineno, written + alias.name, sub if sub in known else target
        elif isinstance(node, ast.Call) and isinstance(node.func, (ast.Attribute, ast.Name)) \
                and (node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id) == "import_module" \
                and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
            name = node.args[0].value
            if name == top or name.startswith(top + "."):
                yield node.lineno, f"import_module({name!r})", name


def upward_imports(modules: dict[str, tuple[str, str, bool]], ranks: dict[str, int] = RANKS) -> list[str]:
    """One line per import from a layer to the importer's right, and per module (or imported module) whose layer
    has no rank. modules: {dotted name: (where, for the message; source; is a package)}."""
    known = set(modules)
    problems = []
    for module, (where, source, is_package) in sorted(modules.items()):
        mine = layer(module)
        if mine not in ranks:
            problems.append(f"{module} ({where}): layer '{mine}' has no rank; place it in RANKS")
            continue
        for line, written, target in imported_modules(module, is_package, source, known):
            theirs = layer(target)
            if theirs not in ranks:
                problems.append(f"{module} ({where}:{line}): `{written}` names {target}, whose layer '{theirs}' "
                                "has no rank; place it in RANKS")
            elif ranks[theirs] > ranks[mine]:
                problems.append(f"{module} ({where}:{line}): `{written}` imports {target}: layer '{mine}' "
                                f"(rank {ranks[mine]}) imports from layer '{theirs}' (rank {ranks[theirs]}), to its "
                                "right")
    return problems


def test_no_module_of_atlas_lab_imports_from_a_layer_to_its_right():
    found = package_modules()
    assert "atlas_lab.memory.dispatch" in found and "atlas_lab.store" in found  # the walk reaches them
    modules = {name: (str(path.relative_to(PACKAGE.parent)), path.read_text(encoding="utf-8"), is_package)
               for name, (path, is_package) in found.items()}
    problems = upward_imports(modules)
    assert not problems, "imports against the layers' order:\n" + "\n".join(problems)


def test_the_checker_reports_an_upward_import():
    """A synthetic package: memory defers an import of sweep inside a function (relative, two levels up), layers
    imports memory and lit imports data (both allowed), and a module of an unranked layer."""
    modules = {
        "atlas_lab": ("atlas_lab/__init__.py", "", True),
        "atlas_lab.memory": ("atlas_lab/memory/__init__.py", "from .op import memorize\n", True),
        "atlas_lab.memory.op": ("atlas_lab/memory/op.py",
                                "import torch\n\n\ndef memorize():\n    from ..sweep import run_sweep\n", False),
        "atlas_lab.layers": ("atlas_lab/layers/__init__.py", "from atlas_lab.memory import op\n", True),
        "atlas_lab.lit": ("atlas_lab/lit/__init__.py", "from ..data.base import AnswerMixin\n", True),
        "atlas_lab.data": ("atlas_lab/data/__init__.py", "", True),
        "atlas_lab.data.base": ("atlas_lab/data/base.py", "", False),
        "atlas_lab.sweep": ("atlas_lab/sweep/__init__.py", "from .. import store\n", True),
        "atlas_lab.store": ("atlas_lab/store.py", "", False),
        "atlas_lab.extra": ("atlas_lab/extra.py", "", False),
    }
    problems = upward_imports(modules)
    assert len(problems) == 2, problems
    upward = next(p for p in problems if "to its right" in p)
    for part in ("atlas_lab.memory.op", "atlas_lab/memory/op.py:5", "from ..sweep import run_sweep",
                 "atlas_lab.sweep", "layer 'memory' (rank 0)", "layer 'sweep' (rank 4)"):
        assert part in upward, (part, upward)
    assert any("atlas_lab.extra" in p and "no rank" in p for p in problems)


@pytest.mark.parametrize("source,expected", [
    ("from ..store import resolve_uri", "atlas_lab.store"),
    ("from .. import store", "atlas_lab.store"),
    ("from . import module", "atlas_lab.lit.module"),
    ("from .module import SequenceModel", "atlas_lab.lit.module"),
    ("import atlas_lab.sweep.tracking", "atlas_lab.sweep.tracking"),
    ("from atlas_lab.memory import memorize", "atlas_lab.memory"),
    ("import importlib\nimportlib.import_module('atlas_lab.sweep')", "atlas_lab.sweep"),
])
def test_imports_resolve_to_the_module_they_name(source, expected):
    known = {"atlas_lab", "atlas_lab.store", "atlas_lab.lit", "atlas_lab.lit.cli", "atlas_lab.lit.module",
             "atlas_lab.sweep", "atlas_lab.sweep.tracking", "atlas_lab.memory"}
    assert [t for _, _, t in imported_modules("atlas_lab.lit.cli", False, source, known)] == [expected]


# The files inside memory/ (memory.ops included), by rank: the same rule one level down. The kernels (ops/) and the
# components' building blocks first, then the optimisers (which use the Newton–Schulz kernels), the learning rules,
# the config and the paths, the plan that chooses among them, and memorize on top.
MEMORY_RANKS = {
    "ops.causal": 0, "ops.limits": 0, "ops.dots": 0, "ops.operators": 0,
    "ops.newton_schulz.cpu": 1, "ops.chunk_linear_memory.naive": 1, "ops.chunk_linear_memory.triton": 1,
    "ops.newton_schulz.reference": 2, "ops.chunk_linear_memory": 2,
    "ops.chunk_mlp_memory.triton": 1,
    "ops.newton_schulz.triton": 3, "ops.newton_schulz": 3, "ops.chunk_mlp_memory.naive": 3,
    "ops.chunk_mlp_memory.muon": 3, "ops.chunk_mlp_memory": 3,
    "ops": 4,
    "components": 0, "state": 0, "cost": 0, "call": 0,
    "feature_maps": 1, "memories": 1, "attentional_biases": 1, "delta_rule": 1, "fla": 1,
    "optimizers": 3,
    "learning_rules": 4,
    "config": 5, "reference": 5, "chunked": 5, "predict": 5,
    "plan": 6,
    "dispatch": 7,
    "op": 8,
    "check": 9,
    "__init__": 10,
}


def memory_file(module: str) -> str:
    """A module of atlas_lab.memory as MEMORY_RANKS names it: ``ops.limits``; ``ops`` for a package's
    ``__init__``; ``__init__`` for atlas_lab.memory itself."""
    return module.removeprefix("atlas_lab.memory").removeprefix(".") or "__init__"


def test_the_files_inside_memory_import_one_way():
    """Every module of atlas_lab.memory has a rank in MEMORY_RANKS and imports only from its rank or below: no import
    cycle inside the engine (config does not import op, the plan does not import what it chooses)."""
    found = {name: item for name, item in package_modules().items() if name.startswith("atlas_lab.memory")}
    assert "atlas_lab.memory.plan" in found and "atlas_lab.memory.ops.limits" in found
    known = set(package_modules())
    problems = []
    for module, (path, is_package) in sorted(found.items()):
        mine = memory_file(module)
        if mine not in MEMORY_RANKS:
            problems.append(f"{module}: no rank; place it in MEMORY_RANKS")
            continue
        for line, written, target in imported_modules(module, is_package, path.read_text(encoding="utf-8"), known):
            theirs = memory_file(target)
            if target.startswith("atlas_lab.memory") and MEMORY_RANKS.get(theirs, 99) > MEMORY_RANKS[mine]:
                problems.append(f"{module}:{line}: `{written}` imports {target} (rank {MEMORY_RANKS.get(theirs)}) "
                                f"from rank {MEMORY_RANKS[mine]}")
    assert not problems, "imports against the order inside memory/:\n" + "\n".join(problems)


def test_the_readme_layout_names_every_module():
    """README.md's Layout section is true to the tree: every module file of atlas_lab is named in the lines of its
    package (a block starts at a line whose first column names a folder or file; a new module without a word there
    fails here)."""
    readme = (PACKAGE.parent / "README.md").read_text(encoding="utf-8")
    layout = readme.split("## Layout", 1)[1].split("```")[1]
    blocks, current = {}, ""
    for line in layout.splitlines():
        head = line[:20].strip().rstrip("/")
        if head.startswith("atlas_lab/"):
            current = head.rsplit(".", 1)[0] if head.endswith(".py") else head
        elif head:  # a subfolder of the block above: "  ops/"
            current = "/".join(current.split("/")[:2] + [head])
        blocks[current] = blocks.get(current, "") + " " + line
    missing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE.parent)
        folder = str(relative.parent)
        text = " ".join(v for k, v in blocks.items() if folder == k or folder.startswith(k + "/") or
                        (folder == "atlas_lab" and k.startswith("atlas_lab/") and k.count("/") == 1))
        if path.name != "__init__.py" and path.name not in text:
            missing.append(str(relative))
    assert not missing, f"README.md's Layout does not name: {missing}"


def test_the_kernels_import_nothing_of_the_engine():
    """memory/ops/ holds kernels only: no module there imports from the memory package outside ops/ (the paths that
    call the kernels, dispatch.py and fla.py, live beside the chunked path)."""
    found = {name: item for name, item in package_modules().items() if name.startswith("atlas_lab.memory.ops")}
    assert "atlas_lab.memory.ops.newton_schulz.reference" in found
    known = set(package_modules())
    problems = [f"{module}:{line}: `{written}` imports {target}"
                for module, (path, is_package) in sorted(found.items())
                for line, written, target in imported_modules(module, is_package, path.read_text(encoding="utf-8"),
                                                              known)
                if target.startswith("atlas_lab.") and not target.startswith("atlas_lab.memory.ops")]
    assert not problems, "kernels importing the engine:\n" + "\n".join(problems)
