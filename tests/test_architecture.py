"""The package's shape (issue 18): no import cycles, small modules, pluggable distances and executors,
settings as objects."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest
from import_graph import assert_acyclic

import gsd_cli
from gsd_cli.distance import Distance, distance_names, register_distance
from gsd_cli.errors import GSDError
from gsd_cli.ranking import RankConfig, rank
from gsd_cli.ranking.executors import _EXECUTORS, register_executor

ROOT = Path(gsd_cli.__file__).parent
MAX_LINES = 400


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = ("gsd_cli",) + path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The gsd_cli modules ``name`` imports (at any depth of its code: lazy imports count too)."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                mod = f"{base}.{node.module}" if node.module else base
            else:
                mod = node.module or ""
            for alias in node.names:
                target = f"{mod}.{alias.name}"
                found.add(target if target in modules else mod)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return {m for m in found if m in modules and m != name}


def test_the_import_graph_has_no_cycle():
    modules = _modules()
    assert_acyclic({m: _imports(m, p, modules) for m, p in modules.items()})


def test_every_module_imports_on_its_own():
    """Each module imported first, in a fresh module table (torch stays loaded): no order dependence."""
    names = sorted(_modules())
    script = (
        "import importlib, sys, torch\n"
        f"for name in {names!r}:\n"
        "    for m in [m for m in sys.modules if m == 'gsd_cli' or m.startswith(('gsd_cli.', 'probes'))]:\n"
        "        del sys.modules[m]\n"
        "    importlib.import_module(name)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]


def test_no_module_is_over_400_lines():
    long = {str(p.relative_to(ROOT)): n for p in ROOT.rglob("*.py") if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines: {long}"


def test_rank_config_round_trips_the_flat_options():
    cfg = RankConfig.from_options(k=8, examples=300, dp=True, epsilon=2.0, model="fmnist-cnn", params="fc*", seed=4)
    assert cfg.gradients.k == 8 and cfg.privacy.epsilon == 2.0 and cfg.model.params == "fc*" and cfg.seed == 4
    assert cfg.distance_name == "dp-select" and RankConfig().distance_name == "gsd"  # DP: the DP selection by default
    assert cfg.replace(dp_sketch=32).distance_name == "dp-gsd" and cfg.replace(mechanism="matrix").distance_name == "dp-gsd"
    assert cfg.replace(distance="dp-gsd").distance_name == "dp-gsd"
    assert RankConfig.from_options(**cfg.options()) == cfg
    assert cfg.replace(k=4).gradients.k == 4 and cfg.gradients.k == 8  # frozen: a copy
    with pytest.raises(GSDError, match="unknown ranking option 'kk'"):
        RankConfig.from_options(kk=3)


def test_config_and_keyword_forms_give_the_same_ranking():
    kw = dict(examples=40, k=3, model="fmnist-cnn", params="fc*", engine="vmap", device="cpu")
    a = rank("mnist-a", ["mnist-b", "noise"], RankConfig.from_options(**kw))
    b = rank("mnist-a", ["mnist-b", "noise"], **kw)
    assert [(r.public, r.distance) for r in a] == [(r.public, r.distance) for r in b]


def test_a_new_distance_plugs_in_without_touching_the_pipeline():
    """A toy distance (the mean principal angle, in [0, 1]) registered from outside the package."""

    @register_distance("mean-angle-test")
    class MeanAngle(Distance):
        def private_side(self, ctx, sample):
            return ctx.subspace(sample)

        def compare(self, private, public):
            d, angles = super().compare(private, public)
            return sum(angles) / len(angles) / 90.0, angles

    try:
        assert "mean-angle-test" in distance_names()
        kw = dict(examples=40, k=3, model="fmnist-cnn", params="fc*", engine="vmap", device="cpu")
        r = rank("mnist-a", ["mnist-b", "noise"], distance="mean-angle-test", **kw)
        plain = {x.public: x for x in rank("mnist-a", ["mnist-b", "noise"], **kw)}
        for x in r:
            assert x.distance == pytest.approx(sum(plain[x.public].principal_angles_deg) / 3 / 90.0)
        assert r.dp is False and r.privacy is None
        with pytest.raises(GSDError, match="unknown distance"):
            rank("mnist-a", ["mnist-b"], distance="nope", **kw)
    finally:
        from gsd_cli.distance import registry

        registry._DISTANCES.pop("mean-angle-test")


def test_a_new_executor_plugs_in_and_order_does_not_matter():
    seen = []

    @register_executor("reversed-test")
    class Reversed:
        def run(self, tasks, compute):
            for t in reversed(tasks):
                seen.append(t.name)
                yield t, compute(t)

    try:
        kw = dict(examples=40, k=3, model="fmnist-cnn", params="fc*", engine="vmap", device="cpu")
        a = rank("mnist-a", ["mnist-b", "noise", "digits"], executor="reversed-test", **kw)
        b = rank("mnist-a", ["mnist-b", "noise", "digits"], **kw)
        assert seen == ["digits", "noise", "mnist-b"]
        assert [(r.public, r.distance) for r in a] == [(r.public, r.distance) for r in b]
        with pytest.raises(GSDError, match="unknown executor"):
            rank("mnist-a", ["mnist-b"], executor="nope", **kw)
    finally:
        _EXECUTORS.pop("reversed-test")


def test_the_cli_and_the_package_load_without_torch():
    """`gsd --help` answers at once: neither `import gsd_cli` nor the CLI's modules load torch (the
    commands import the library when they run)."""
    code = "import sys, gsd_cli, gsd_cli.cli; assert 'torch' not in sys.modules, 'torch was imported'; print(gsd_cli.__version__)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


# --- the layers of the data flow (issue 35) ------------------------------------------------------------
#: each top-level part of gsd_cli and its layer: a module may import its own layer and those below,
#: never one above (privacy knows nothing of training; data nothing of models or gradients)
LAYERS = {
    "": 0, "errors": 0, "defaults": 0, "registry": 0, "memory": 0, "allocator": 0, "units": 0, "timing": 0,  # cross-cutting
    "data": 1,
    "privacy": 2, "models": 2,
    "gradients": 3,
    "subspace": 4, "ghost": 4,
    "distance": 5,
    "ranking": 6, "report": 6,
    "train": 7,
    "advice": 8,  # issue 63: which public set, which method, or none; it imports the trainers, they never import it
    "audit": 9, "integrations": 9,
    "cli": 10,
}


def _layer(module: str) -> int:
    parts = module.split(".")[1:]
    top = parts[0] if parts else ""
    assert top in LAYERS, f"{module}: add its part to LAYERS (tests/test_architecture.py) and the architecture page"
    return LAYERS[top]


def test_no_import_runs_from_a_lower_layer_to_a_higher_one():
    modules = _modules()
    up = sorted(f"{m} -> {n}" for m, p in modules.items() for n in _imports(m, p, modules) if _layer(n) > _layer(m))
    assert not up, "imports against the layer order:\n" + "\n".join(up)


def test_the_old_import_paths_still_work():
    """Modules moved into packages in 0.2 are the same module objects under their old names."""
    import importlib

    for old, new in gsd_cli.MOVED.items():
        assert importlib.import_module(old) is importlib.import_module(new), old
    from gsd_cli.opacus import GEPOptimizer  # noqa: F401 (a user's script of 0.1)
    from gsd_cli.privacy.audit import audit  # noqa: F401


def test_top_level_modules_are_few():
    """Besides __init__ and the packages, only the cross-cutting modules: errors, defaults, registry
    (the plug-in registry), memory (size checks before allocating), allocator (the process's malloc) and units
    (how durations are written, for the CLI's progress and the trainer's plan alike), timing (stage wall
    times for benchmarks)."""
    top = sorted(p.stem for p in ROOT.glob("*.py") if p.stem != "__init__")
    assert set(top) == {"errors", "defaults", "registry", "memory", "allocator", "units", "timing"}, top


#: within a layer, the order of its parts (issue 51): the ranking is presented by report, never the reverse; the
#: ghost (Gram) engine builds on subspace's top-k; privacy and models know nothing of each other
WITHIN_LAYER = {"ranking": 0, "report": 1, "subspace": 0, "ghost": 1}


def _part(module: str) -> str:
    parts = module.split(".")[1:]
    return parts[0] if parts else ""


def test_no_import_runs_up_within_a_layer_and_the_packages_form_no_circle():
    """Issue 51's measures: 0 arrows from a lower package to a higher one (the layers, and the order within a layer),
    0 import circles between packages (lazy imports count)."""
    modules = _modules()
    edges = {(_part(m), _part(n)) for m, p in modules.items() for n in _imports(m, p, modules) if _part(m) != _part(n)}
    up = sorted(f"{a} -> {b}" for a, b in edges if _layer(f"gsd_cli.{a}") == _layer(f"gsd_cli.{b}") and a in WITHIN_LAYER
                and b in WITHIN_LAYER and WITHIN_LAYER[a] < WITHIN_LAYER[b])
    assert not up, "imports against the order within a layer:\n" + "\n".join(up)
    graph: dict[str, set] = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
    assert_acyclic(graph, "packages import each other in a circle")


# --- the advice, a floor above the trainers (issue 63) ---------------------------------------------------
#: the most modules gsd_cli/train/ may hold: its .py files directly in it, __init__.py included; a sub-package
#: (train/clipsum/, train/gep/, train/second_phase/, train/distributed/: one unit each, its own docstring) counts as
#: none, and the old paths of moved modules are served by gsd_cli.DEPRECATED's finder, not by files here
TRAIN_MODULES = 25


def test_train_holds_few_modules_and_none_of_the_advice():
    files = sorted(p.name for p in (ROOT / "train").glob("*.py"))
    assert len(files) <= TRAIN_MODULES, f"gsd_cli/train/ holds {len(files)} modules (at most {TRAIN_MODULES}): {files}"
    modules = _modules()
    up = sorted(f"{m} -> {n}" for m, p in modules.items() if _part(m) == "train" for n in _imports(m, p, modules) if _part(n) == "advice")
    assert not up, up


def test_each_advice_module_says_first_what_it_decides():
    for path in sorted((ROOT / "advice").glob("*.py")):
        first = (ast.get_docstring(ast.parse(path.read_text())) or "").splitlines()[:1]
        assert first and first[0].startswith(("Which ", "Whether ")), f"advice/{path.name}: {first}"


def test_the_moved_advice_paths_work_for_one_release_and_warn():
    """``gsd_cli.train.select`` and the other moved modules are the advice's modules under their old names, and a
    DeprecationWarning names the new one; so do the names ``gsd_cli.train`` exported (``auto_select``, ...)."""
    import importlib

    import gsd_cli.train

    for old, new in gsd_cli.DEPRECATED.items():
        sys.modules.pop(old, None)  # the alias only: the finder answers again
        with pytest.warns(DeprecationWarning, match=f"{old} has moved to {new}"):
            assert importlib.import_module(old) is importlib.import_module(new)
    for name, new in gsd_cli.DEPRECATED_NAMES["gsd_cli.train"].items():
        with pytest.warns(DeprecationWarning, match=f"gsd_cli.train.{name} has moved to {new}.{name}"):
            assert getattr(gsd_cli.train, name) is getattr(importlib.import_module(new), name)
    with pytest.raises(AttributeError):
        gsd_cli.train.no_such_name  # noqa: B018


def test_every_data_file_in_the_package_is_shipped():
    """A figure file under gsd_cli/ that pyproject's package-data does not name is absent from an installed gsd (round
    7's note was: `gsd rank --validity` printed round 6 first from a wheel, while the work tree printed round 7). Where
    gsd is installed from a wheel (CI), the installed package is checked to hold each file too."""
    import fnmatch
    import tomllib

    repo = Path(__file__).resolve().parents[1]  # the work tree (ROOT is the imported package, maybe site-packages)
    conf = tomllib.loads((repo / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    files = subprocess.run(["git", "ls-files", "gsd_cli"], cwd=repo, capture_output=True, text=True).stdout.split()
    if not files:
        pytest.skip("not a git work tree")
    data = [Path(f) for f in files if not f.endswith(".py")]
    assert data, "the package ships figure files (gsd_cli/report/*.json)"
    for f in data:
        package = ".".join(f.parent.parts)
        assert any(fnmatch.fnmatch(f.name, p) for p in conf.get(package, [])), f"{f} is not in pyproject's package-data"
        assert (ROOT / f.relative_to("gsd_cli")).is_file(), f"{f} is missing from the installed gsd_cli ({ROOT})"
