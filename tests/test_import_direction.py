"""The direction of imports (README "Layout"): every module imports only from floors below
its own, and a few packages on one floor stay apart. Read from the source with `ast`, function
-level imports included, so a late `import` cannot hide an edge."""

import ast
from pathlib import Path

import trainformer

PACKAGE = Path(trainformer.__file__).parent
# Lowest floor first. A module may import its own package and anything on a lower floor.
FLOORS = [
    {"errors", "tokens", "__init__"},  # the ground floor: errors, special tokens, files, the run directory
    {"config", "files", "quiet", "xla_flags", "framework_import", "images"},
    {"run_dir"},
    {"data", "model", "train"},  # train/ is the engine: loop, strategy, checkpoint, optim, precision, ...
    {"tasks"},
    {"run"},  # run orchestration: a task put together with the engine
    {"export", "serve", "ops", "interop"},
    {"launch"},  # local worker processes, started by the cli
    {"cli"},
    {"__main__"},
]
# Packages on one floor that must not lean on each other, and what serve may use at all.
APART = {"data": {"model", "train"}, "model": {"data", "train"}, "train": {"data", "model"}}
SERVE_MAY_IMPORT = {"serve", "errors", "files", "quiet", "config"}  # serving needs only an exported graph


def unit(module: str) -> str:
    """trainformer.train.loop -> "train"; trainformer.config -> "config"."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def floor(name: str) -> int:
    return next(i for i, names in enumerate(FLOORS) if name in names)


def imports_of(path: Path, package: Path = PACKAGE) -> set[str]:
    module = "trainformer." + ".".join(path.relative_to(package).with_suffix("").parts)
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this module's package
                base = module.split(".")[: -node.level]
                found.add(".".join(base + ([node.module] if node.module else [])))
            elif node.module:
                found.add(node.module)
    return {name for name in found if name == "trainformer" or name.startswith("trainformer.")}


def edges():
    for path in sorted(PACKAGE.rglob("*.py")):
        source = "trainformer." + ".".join(path.relative_to(PACKAGE).with_suffix("").parts)
        for target in imports_of(path):
            yield source, target


def test_every_module_is_on_a_floor():
    units = {unit("trainformer." + ".".join(p.relative_to(PACKAGE).with_suffix("").parts)) for p in PACKAGE.rglob("*.py")}
    assert units <= set().union(*FLOORS), f"put these on a floor in tests/test_import_direction.py: {units - set().union(*FLOORS)}"


def test_imports_only_go_down():
    wrong = [f"{a} -> {b}" for a, b in edges()
             if unit(a) != unit(b) and floor(unit(b)) >= floor(unit(a))]
    assert not wrong, "imports that go up or sideways:\n" + "\n".join(wrong)


def test_the_engine_model_and_data_stay_apart_and_serve_needs_only_the_ground():
    wrong = [f"{a} -> {b}" for a, b in edges()
             if unit(b) in APART.get(unit(a), ()) or (unit(a) == "serve" and unit(b) not in SERVE_MAY_IMPORT)]
    assert not wrong, "\n".join(wrong)


def test_the_check_sees_an_upward_import(tmp_path):
    """The reader finds imports inside functions and relative ones: the kinds that hide."""
    (tmp_path / "trainformer" / "model").mkdir(parents=True)
    late = tmp_path / "trainformer" / "model" / "late.py"
    late.write_text("def f():\n    from ..data.tokenizer import CLS_ID\n    import trainformer.tasks\n")
    assert imports_of(late, tmp_path / "trainformer") == {"trainformer.data.tokenizer", "trainformer.tasks"}
