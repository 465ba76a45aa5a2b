"""The two tiers, decided by what a test uses: nobody marks a test `integration` by hand.

A test is integration when its code, a fixture it requests or a helper of the
suite they call (to any depth, read from code objects) uses one of `HEAVY`, or
when its parameter is a preset deeper than `DEEPEST_FAST`. What the analysis
cannot see (a heavy call through an object built at run time) fails the test
through `guard()`, naming the entry point to reach through a helper or fixture.
"""

from __future__ import annotations

import contextlib
import dis
import importlib
import inspect
import subprocess
import types

# Names whose use puts a test in the integration tier, by the module that owns them.
HEAVY = {
    "subprocess": ("Popen", "run", "check_call", "check_output", "call"),
    "resnet_app.engine.loop": ("train_and_evaluate", "train"),
    "resnet_app.export.savedmodel": ("save",),
    "resnet_app.export.tflite": ("convert",),
    "resnet_app.export.onnx_export": ("convert",),
    "tests.commands": ("run_command", "run_code", "start_command", "start_code"),
    "resnet_app.data.input_pipeline": ("create_pipeline",),  # A run's whole input pipeline.
    "resnet_app.common.distribute": ("mirrored_strategy",),  # Several towers.
    "resnet_app.sweep.runner": ("Sweep",),  # Each trial a training process.
}

# The entry points that start processes, and those that run towers (whose replicas
# wait on each other when another process holds the cores): conftest.py runs the
# tests that reach either one at a time.
PROCESSES = {
    module: HEAVY[module] for module in ("subprocess", "tests.commands", "resnet_app.sweep.runner")
}
TOWERS = {"resnet_app.common.distribute": HEAVY["resnet_app.common.distribute"]}

# Deeper presets build an ImageNet-size graph: ResNet-34 is the deepest in the fast tier.
DEEPEST_FAST = 49


def preset_depth(name: str) -> int:
    """The depth of the preset `name`; 0 for any other value."""
    from resnet_app.nets import presets

    if name not in presets.model_names(include_test_only=True):
        return 0
    return presets.get_config(name).depth


def _codes(code: types.CodeType):
    """`code` and its nested functions' code, outer first."""
    yield code
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):
            yield from _codes(constant)


def _names(code: types.CodeType) -> set[str]:
    """Every global and attribute name a code object loads, nested functions included."""
    return set().union(*(nested.co_names for nested in _codes(code)))


def _towers(code: types.CodeType) -> str | None:
    """A run configured with `num_towers` (a keyword or a `train.num_towers=` setting)."""
    for constant in (c for nested in _codes(code) for c in nested.co_consts):
        setting = isinstance(constant, str) and "num_towers=" in constant
        if setting or (isinstance(constant, tuple) and "num_towers" in constant):
            return "train.num_towers"
    return None


def _imports(code: types.CodeType) -> dict:
    """What the function's own `import` statements bind: {local name: module or object}."""
    bound = {}
    for nested in _codes(code):
        module = value = None
        for instruction in dis.get_instructions(nested):
            if instruction.opname == "IMPORT_NAME":
                module = value = _load(instruction.argval)
            elif instruction.opname == "IMPORT_FROM" and module is not None:
                value = getattr(module, instruction.argval, None) or _load(
                    f"{module.__name__}.{instruction.argval}"
                )
            elif instruction.opname.startswith("STORE_") and value is not None:
                bound[instruction.argval] = value
                value = None
    return bound


def _load(name: str):
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def _own(obj) -> bool:
    """A module, function or class of the test suite, which the analysis follows."""
    module = (obj.__name__ if isinstance(obj, types.ModuleType) else obj.__module__) or ""
    return module == "tests" or module.startswith("tests.") or module.startswith("test_")


def _fixtures(item):
    """(name, definition) of each fixture the collected test requests."""
    infos = getattr(item, "_fixtureinfo", None)
    definitions = infos.name2fixturedefs if infos else {}
    return [(name, d) for name in item.fixturenames for d in definitions.get(name, ())]


class Analysis:
    """Finds what tests reach, reading each function once.

    Args:
      entries: the entry points looked for, by module: `HEAVY` (the default,
        with `num_towers` settings), `PROCESSES` or `TOWERS`.
    """

    def __init__(self, entries: dict | None = None):
        self._entries = HEAVY if entries is None else entries
        self._heavy = {
            id(getattr(importlib.import_module(module), name)): f"{module}.{name}"
            for module, names in self._entries.items()
            for name in names
        }
        self._seen: dict[int, str | None] = {}

    def function(self, function) -> str | None:
        """The entry point `function` reaches (a dotted name), or None."""
        function = inspect.unwrap(function)
        key = id(function)
        if key in self._seen:
            return self._seen[key]
        self._seen[key] = None  # Recursion ends here.
        code = getattr(function, "__code__", None)
        if code is None:
            return None
        scope = {**getattr(function, "__globals__", {}), **_imports(code)}
        found = self._names_in(_names(code), scope)
        if not found and "resnet_app.common.distribute" in self._entries:
            found = _towers(code)
        self._seen[key] = found
        return found

    def _names_in(self, names: set[str], scope: dict) -> str | None:
        for name in sorted(names & scope.keys()):
            value = scope[name]
            if id(value) in self._heavy:
                return self._heavy[id(value)]
            candidates = [value]
            if isinstance(value, types.ModuleType):
                # `module.NAME`: an entry point of that module, or a helper of the suite.
                heavy = [n for n in self._entries.get(value.__name__, ()) if n in names]
                if heavy:
                    return f"{value.__name__}.{heavy[0]}"
                candidates = [getattr(value, n, None) for n in sorted(names)] if _own(value) else []
            for candidate in candidates:
                found = callable(candidate) and _own(candidate) and self._follow(candidate)
                if found:
                    return found
        return None

    def _follow(self, value) -> str | None:
        """What a function reaches, or the first method of a class that reaches something."""
        if not inspect.isclass(value):
            return self.function(value)
        for method in vars(value).values():
            method = getattr(method, "__func__", method)
            found = inspect.isfunction(method) and self.function(method)
            if found:
                return found
        return None

    def item(self, item) -> str | None:
        """Why a collected test is integration (what it reaches, and through what), or None."""
        found = self.function(item.function)
        if found:
            return found
        for name, definition in _fixtures(item):
            found = self.function(definition.func)
            if found:
                return f"{found} (fixture {name})"
        for value in getattr(getattr(item, "callspec", None), "params", {}).values():
            found = callable(value) and _own(value) and self.function(value)
            if found:
                return found
            depth = preset_depth(value) if isinstance(value, str) else 0
            if depth > DEEPEST_FAST and self._entries is HEAVY:
                return f"the {value} network ({depth} layers)"
        return None


def shares_module_state(item) -> bool:
    """Whether the test uses what its module keeps for several tests: a cached
    function of the module, or a fixture of module or wider scope it defines."""
    scope = getattr(item.function, "__globals__", {})
    if any(hasattr(scope.get(name), "cache_info") for name in _names(item.function.__code__)):
        return True
    module = item.nodeid.split("::")[0]
    return any(d.baseid == module and d.scope != "function" for _, d in _fixtures(item))


class FastTierError(AssertionError):
    pass


@contextlib.contextmanager
def guard(test_id: str):
    """Inside a fast-tier test, every HEAVY entry point fails the test instead of running."""

    def refuse(dotted):
        def refused(*args, **kwargs):
            raise FastTierError(
                f"{test_id} reached {dotted}, which belongs to the integration tier, "
                "but tests/tiers.py did not see it: call it from the test, a helper "
                "in tests/ or a fixture, so that the test is classified"
            )

        return refused

    # Every way of starting a process ends in _execute_child, however Popen was imported.
    patches = [(subprocess.Popen, "_execute_child", "a subprocess")]
    for module_name, names in HEAVY.items():
        if module_name not in ("tests.commands", "subprocess"):
            module = importlib.import_module(module_name)
            patches += [(module, name, f"{module_name}.{name}") for name in names]
    originals = [(owner, name, getattr(owner, name)) for owner, name, _ in patches]
    for owner, name, dotted in patches:
        setattr(owner, name, refuse(dotted))
    try:
        yield
    finally:
        for owner, name, original in originals:
            setattr(owner, name, original)
