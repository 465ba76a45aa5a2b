"""tests/tiers.py: a test's tier follows from what it uses, and the fast tier cannot lie.

The toy tests are compiled from text, so that the analysis does not make these tests integration.
"""

import subprocess
import textwrap
import types

import pytest

from tests import slow_tier, tiers


def _functions(source: str) -> dict:
    """The functions `source` defines, in a module of the test suite (`tests.toy`)."""
    module = types.ModuleType("tests.toy")
    exec(compile(textwrap.dedent(source), "<toy>", "exec"), module.__dict__)
    for value in vars(module).values():
        if isinstance(value, types.FunctionType):
            value.__module__ = "tests.toy"
    return vars(module)


TOYS = """
from tests.commands import run_command

def helper(path):
    return run_command("resnet_app.evaluate", f"--model_dir={path}")

def deeper(path):
    return helper(path) or 1

def test_through_helpers(tmp_path):
    assert deeper(tmp_path)

def test_imports_inside(tmp_path):
    from resnet_app.engine import loop
    loop.train_and_evaluate(None, str(tmp_path))

def test_towers(tmp_path):
    config(tmp_path, num_towers=2)

def test_deep_setting(tmp_path):
    run(tmp_path, "train.num_towers=3")

def test_numbers():
    import numpy as np
    assert np.add(1, 2) == 3

def config(*args, **kwargs):
    return args, kwargs

def run(*args):
    return args
"""


@pytest.mark.parametrize(
    "name, reason",
    [
        ("test_through_helpers", "tests.commands.run_command"),
        ("test_imports_inside", "resnet_app.engine.loop.train_and_evaluate"),
        ("test_towers", "train.num_towers"),
        ("test_deep_setting", "train.num_towers"),
        ("test_numbers", None),
    ],
)
def test_a_test_is_integration_by_what_it_reaches(name, reason):
    assert tiers.Analysis().function(_functions(TOYS)[name]) == reason


@pytest.mark.parametrize(
    "name, reason",
    [
        ("test_through_helpers", "tests.commands.run_command"),
        ("test_imports_inside", None),
        ("test_towers", None),
        ("test_numbers", None),
    ],
)
def test_the_tests_that_start_processes_are_found_as_the_tiers_are(name, reason):
    """Only the process entry points count: training in process or on towers does not."""
    assert tiers.Analysis(tiers.PROCESSES).function(_functions(TOYS)[name]) == reason


@pytest.mark.parametrize(
    "name, reason",
    [
        ("test_through_helpers", None),
        ("test_imports_inside", None),
        ("test_towers", "train.num_towers"),
        ("test_deep_setting", "train.num_towers"),
        ("test_numbers", None),
    ],
)
def test_the_tests_that_run_towers_are_found_as_the_tiers_are(name, reason):
    assert tiers.Analysis(tiers.TOWERS).function(_functions(TOYS)[name]) == reason


def test_a_test_that_runs_towers_runs_in_the_process_group(request):
    from resnet_app.common import distribute

    assert distribute.mirrored_strategy(["/cpu:0", "/cpu:1"]).num_replicas_in_sync == 2
    group = request.node.get_closest_marker("xdist_group")
    assert group is not None and group.args == ("processes",)


def test_a_test_that_starts_a_process_runs_in_the_process_group(request):
    """Its module keeps nothing for it: it joins the tests that run one at a time."""
    subprocess.run(["true"], check=True)
    group = request.node.get_closest_marker("xdist_group")
    assert group is not None and group.args == ("processes",)


def test_deep_presets_go_by_their_depth():
    assert tiers.preset_depth("resnet50") == 50 > tiers.DEEPEST_FAST
    assert tiers.preset_depth("resnet34") == 34 <= tiers.DEEPEST_FAST
    assert tiers.preset_depth("not a preset") == 0


def test_the_guard_refuses_every_heavy_entry_point_and_puts_them_back():
    from resnet_app.engine import loop
    from resnet_app.export import savedmodel

    originals = (loop.train_and_evaluate, savedmodel.save)
    with tiers.guard("tests/x.py::test_y"):
        with pytest.raises(tiers.FastTierError, match=r"test_y reached a subprocess"):
            subprocess.run(["true"], check=True)
        with pytest.raises(tiers.FastTierError, match="loop.train_and_evaluate"):
            loop.train_and_evaluate(None, "nowhere")
        with pytest.raises(tiers.FastTierError, match="savedmodel.save"):
            savedmodel.save()
    assert (loop.train_and_evaluate, savedmodel.save) == originals


def test_no_test_is_marked_integration_by_hand(request):
    """Every `integration` mark of the session carries the reason the analysis found."""
    marks = [
        (item.nodeid, mark)
        for item in request.session.items
        for mark in item.iter_markers("integration")
    ]
    assert all(mark.kwargs.get("reason") for _, mark in marks), [
        nodeid for nodeid, mark in marks if not mark.kwargs.get("reason")
    ]


def test_every_test_moved_to_the_slow_tier_names_its_cover_in_the_suite():
    """A representative that is not a test, or is slow itself, fails the collection."""
    key = "test_matrix_own_data.py::test_every_command_works_or_refuses_in_one_line[idx]"
    _, kept = slow_tier.MOVED[key]
    assert kept.split("::")[0] != key.split("::")[0]
    one = {key: slow_tier.MOVED[key]}
    collected = {key: "slow", kept: None}
    assert slow_tier.check(collected, one) == []
    assert slow_tier.check({key: "slow", kept: "slow"}, one) == [
        f"{key} is covered by {kept}, which is in the slow tier too"
    ]
    other = kept.split("::")[0] + "::test_something_else"
    assert slow_tier.check({key: "slow", other: None}, one) == [
        f"{key} is covered by {kept}, which is not a test"
    ]
    assert slow_tier.check({key.split("::")[0] + "::renamed": None}, one) == [
        f"tests/slow_tier.py moves {key}, which is not a test"
    ]


FORWARD = "test_model.py::test_forward_pass_logits_and_hidden_states"
DRIFT = "test_averaging.py::test_copies_drift_between_averages_and_become_their_mean"


@pytest.mark.parametrize(
    "nodeid,params,moved",
    [
        (f"{FORWARD}[resnet101]", {"name": "resnet101"}, True),
        (f"{FORWARD}[resnet50]", {"name": "resnet50"}, False),
        (f"{DRIFT}[2]", {"towers": 2}, False),
        (f"{DRIFT}[3]", {"towers": 3}, True),
    ],
)
def test_the_slow_tier_takes_the_deeper_presets_and_the_named_parameters(nodeid, params, moved):
    assert (slow_tier.reason(nodeid, params) is not None) == moved


@pytest.fixture(scope="module")
def kept_by_the_module():
    return object()


def test_a_test_sharing_its_modules_fixture_is_in_the_modules_xdist_group(
    kept_by_the_module, request
):
    """Collection puts it in its module's group, so the fixture is built in one process."""
    group = request.node.get_closest_marker("xdist_group")
    assert group is not None and group.args == (request.node.module.__name__,)
