"""The two tiers, decided by what a test uses: nobody marks a test `integration` by hand.

A test is in the integration tier when its code, a fixture it requests, or a
helper of the test suite that either calls (followed to any depth) uses one of
`HEAVY` (a training run, an export, a subprocess, several towers, a run's whole
input pipeline), or when its parameter is a preset network deeper than
`DEEPEST_FAST`. The analysis reads code
objects (the names a function loads, its nested functions' too), so it sees a
call however deep in `tests/` it is made.

What the analysis cannot see (a heavy call reached through an object the test
builds at run time) is caught when it happens: `guard()` makes every heavy
entry point fail a fast-tier test, in the whole suite as in `--fast`, naming
the entry point; the fix is to reach it through a helper or fixture that the
analysis sees.
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
    # The whole input pipeline of a run: a dataset read, decoded, augmented, batched.
    "resnet_app.data.input_pipeline": ("create_pipeline",),
    # Several towers: replicas that train in step, each with its own threads.
    "resnet_app.common.distribute": ("mirrored_strategy",),
    # A sweep: each trial a training process.
    "resnet_app.sweep.runner": ("Sweep",),
}


# The entry points of HEAVY that start processes: the tests that reach them run
# one at a time (`conftest.py`), so two tests' processes never share the cores.
PROCESSES = {
    module: HEAVY[module] for module in ("subprocess", "tests.commands", "resnet_app.sweep.runner")
}
# Several towers in the test's own process (or a `num_towers` setting): their
# replicas meet at every collective, and wait the longest when another
# process's threads hold the cores; they run in the same group as PROCESSES.
TOWERS = {"resnet_app.common.distribute": HEAVY["resnet_app.common.distribute"]}


# A test of a preset network this deep or deeper (by its parameter) builds an
# ImageNet-size graph: ResNet-34 is the deepest in the fast tier.
DEEPEST_FAST = 49


def preset_depth(name: str) -> int:
    """The depth of the preset `name`; 0 for any other value."""
    from resnet_app.nets import presets

    if name not in presets.model_names(include_test_only=True):
        return 0
    return presets.get_config(name).depth


def _heavy_objects(entries: dict) -> dict[int, str]:
    found = {}
    for module_name, names in entries.items():
        module = importlib.import_module(module_name)
        for name in names:
            found[id(getattr(module, name))] = f"{module_name}.{name}"
    return found


def _module_attribute_is_heavy(
    module: types.ModuleType, names: set[str], entries: dict
) -> str | None:
    """`module.NAME` where NAME is one of the entry points of that module."""
    for name in entries.get(module.__name__, ()):
        if name in names:
            return f"{module.__name__}.{name}"
    return None


def _names(code: types.CodeType) -> set[str]:
    """Every global and attribute name a code object loads, nested functions included."""
    names = set(code.co_names)
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):
            names |= _names(constant)
    return names


def _towers(code: types.CodeType) -> str | None:
    """A run configured with `num_towers` (a keyword or a `train.num_towers=` setting)."""
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType) and _towers(constant):
            return "train.num_towers"
        setting = isinstance(constant, str) and "num_towers=" in constant
        if setting or (isinstance(constant, tuple) and "num_towers" in constant):
            return "train.num_towers"
    return None


def _imports(code: types.CodeType) -> dict:
    """What the function's own `import` statements bind: {local name: module or object}."""
    bound, module, value = {}, None, None
    for instruction in dis.get_instructions(code):
        if instruction.opname == "IMPORT_NAME":
            module = value = _load(instruction.argval)
        elif instruction.opname == "IMPORT_FROM" and module is not None:
            value = getattr(module, instruction.argval, None) or _load(
                f"{module.__name__}.{instruction.argval}"
            )
        elif instruction.opname.startswith("STORE_") and value is not None:
            bound[instruction.argval] = value
            value = None
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):
            bound.update(_imports(constant))
    return bound


def _load(name: str):
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def _own(obj) -> bool:
    """A function or class of the test suite (its helpers), which the analysis follows."""
    module = (obj.__name__ if isinstance(obj, types.ModuleType) else obj.__module__) or ""
    return module == "tests" or module.startswith("tests.") or module.startswith("test_")


class Analysis:
    """Remembers what each function uses, so a helper shared by many tests is read once.

    Args:
      entries: the entry points looked for, by module (default `HEAVY`, with
        runs on several towers; `PROCESSES` finds the tests that start
        processes, `TOWERS` those that run several towers).
    """

    def __init__(self, entries: dict | None = None):
        self._entries = HEAVY if entries is None else entries
        self._heavy = _heavy_objects(self._entries)
        self._seen: dict[int, str | None] = {}

    def function(self, function) -> str | None:
        """The heavy entry point `function` reaches (a dotted name), or None."""
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
        for name in sorted(names):
            if name not in scope:
                continue
            value = scope[name]
            if id(value) in self._heavy:
                return self._heavy[id(value)]
            if isinstance(value, types.ModuleType):
                found = _module_attribute_is_heavy(value, names, self._entries)
                if found is None and _own(value):
                    found = self._module_functions(value, names)
            elif inspect.isclass(value) and _own(value):
                found = self._class(value)
            elif callable(value) and _own(value):
                found = self.function(value)
            else:
                continue
            if found:
                return found
        return None

    def _module_functions(self, module: types.ModuleType, names: set[str]) -> str | None:
        """`helpers.NAME(...)` for a module of the suite: follows NAME."""
        for name in sorted(names):
            value = getattr(module, name, None)
            if callable(value) and _own(value):
                found = self._class(value) if inspect.isclass(value) else self.function(value)
                if found:
                    return found
        return None

    def _class(self, cls) -> str | None:
        for value in vars(cls).values():
            value = getattr(value, "__func__", value)
            if inspect.isfunction(value):
                found = self.function(value)
                if found:
                    return found
        return None

    def item(self, item) -> str | None:
        """Why a collected test is integration (what it reaches, and through what), or None."""
        found = self.function(item.function)
        if found:
            return found
        infos = getattr(item, "_fixtureinfo", None)
        for name in item.fixturenames:
            for definition in infos.name2fixturedefs.get(name, ()) if infos else ():
                found = self.function(definition.func)
                if found:
                    return f"{found} (fixture {name})"
        for value in getattr(getattr(item, "callspec", None), "params", {}).values():
            if callable(value) and _own(value):
                found = self.function(value)
                if found:
                    return found
            depth = preset_depth(value) if isinstance(value, str) else 0
            if depth > DEEPEST_FAST and self._entries is HEAVY:
                return f"the {value} network ({depth} layers)"
        return None


def shares_module_state(item) -> bool:
    """Whether the test uses what its module keeps for several tests: a fixture of
    module or wider scope that the module defines, or a cached function of it."""
    scope = getattr(item.function, "__globals__", {})
    for name in _names(item.function.__code__):
        if hasattr(scope.get(name), "cache_info"):
            return True
    infos = getattr(item, "_fixtureinfo", None)
    if infos is None:
        return False
    for name in item.fixturenames:
        for definition in infos.name2fixturedefs.get(name, ()):
            in_module = definition.baseid == item.nodeid.split("::")[0]
            if in_module and definition.scope != "function":
                return True
    return False


class FastTierError(AssertionError):
    pass


@contextlib.contextmanager
def guard(test_id: str):
    """Inside a fast-tier test, every HEAVY entry point fails the test instead of running."""
    originals = []

    def refuse(dotted):
        def refused(*args, **kwargs):
            raise FastTierError(
                f"{test_id} reached {dotted}, which belongs to the integration tier, "
                "but tests/tiers.py did not see it: call it from the test, a helper "
                "in tests/ or a fixture, so that the test is classified"
            )

        return refused

    for module_name, names in HEAVY.items():
        if module_name in ("tests.commands", "subprocess"):
            continue  # They start processes: guarded below, however Popen was imported.
        module = importlib.import_module(module_name)
        for name in names:
            originals.append((module, name, getattr(module, name)))
            setattr(module, name, refuse(f"{module_name}.{name}"))
    originals.append((subprocess.Popen, "_execute_child", subprocess.Popen._execute_child))
    subprocess.Popen._execute_child = refuse("a subprocess")
    try:
        yield
    finally:
        for module, name, original in originals:
            setattr(module, name, original)
