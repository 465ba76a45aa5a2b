"""Session setup: the CPU is split into 3 logical devices, so that tests can
run towers (MirroredStrategy replicas) on any machine. This must happen before
TensorFlow initializes its devices, hence at import, before any test runs."""

import collections
import contextlib
import os

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

NUM_LOGICAL_CPUS = 3
PROCESS_GROUP = "processes"  # The tests that start processes or run towers, one at a time.

_cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(
    _cpu, [tf.config.LogicalDeviceConfiguration()] * NUM_LOGICAL_CPUS
)


def pytest_addoption(parser):
    parser.addoption(
        "--fast",
        action="store_true",
        help="the fast tier: leave out the tests marked integration (training runs, "
        "subprocesses, several workers); CI runs everything",
    )


@pytest.hookimpl(tryfirst=True)  # Before xdist reads the groups.
def pytest_collection_modifyitems(config, items):
    """Marks `integration` every test that trains, exports or starts a process (tests/tiers.py),
    and `slow` the repeats that tests/slow_tier.py names, before `-m` selects.

    Tests share a worker process only when they share what their module keeps
    (a trained run, a dataset, built networks): they are one `xdist_group`. The
    other tests that start processes or run several towers are one group too,
    so they run one after another while the other worker runs tests in its own
    process: two tests' processes never contend for the two cores (their thread
    pools spin while they wait, and a stalled peer's timeouts stretch), and
    towers, whose replicas meet at every collective, do not wait on a process's
    threads (three towers averaging their copies took 24 s beside a launcher's
    workers, 4 s alone). Every other test goes to whichever worker is free
    (`--dist loadgroup`).
    """
    from tests import slow_tier, tiers

    analysis, collected = tiers.Analysis(), {}
    grouped = tiers.Analysis({**tiers.PROCESSES, **tiers.TOWERS})
    for item in items:
        reason = analysis.item(item)
        if reason:
            item.add_marker(pytest.mark.integration(reason=reason))
        params = getattr(getattr(item, "callspec", None), "params", {})
        slow = slow_tier.reason(item.nodeid.removeprefix("tests/"), params)
        if slow:
            item.add_marker(pytest.mark.slow(reason=slow))
        collected[item.nodeid.removeprefix("tests/")] = slow
        if tiers.shares_module_state(item):
            item.add_marker(pytest.mark.xdist_group(item.module.__name__))
        elif grouped.item(item):
            item.add_marker(pytest.mark.xdist_group(PROCESS_GROUP))
    problems = slow_tier.check(collected)
    if problems:
        raise pytest.UsageError("\n".join(problems))
    # The files with the most training runs and processes first, each file's
    # tests together: the light ones fill the end, and neither process waits
    # alone on a long file after the other has finished.
    heavy = collections.Counter(i.module.__name__ for i in items if "integration" in i.keywords)
    items.sort(key=lambda item: -heavy[item.module.__name__])
    if not config.getoption("--fast"):
        return
    kept = [item for item in items if "integration" not in item.keywords]
    config.hook.pytest_deselected(items=[item for item in items if item not in kept])
    items[:] = kept


def _guarded(item):
    from tests import tiers

    if "integration" in item.keywords:
        return contextlib.nullcontext()
    return tiers.guard(item.nodeid)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    with _guarded(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    with _guarded(item):
        return (yield)


@pytest.fixture
def op_determinism_off_after():
    """`train.deterministic` turns TensorFlow's op determinism on for the whole process
    (and a later test's input timing would fail): off again after the test."""
    yield
    from tensorflow.python.framework import config as tf_config

    tf_config.disable_op_determinism()


EVAL_EXAMPLES = 37  # Not a multiple of any batch size used in tests: the last batch is padded.


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory):
    """A 4-step run of the tiny network on 64 `shapes` images, checkpoints at steps 2 and 4.

    Shared by the tests of the commands that use a trained run (evaluate,
    export, predict, plot_metrics). Tests that change the run directory work
    on a copy; appending to its metrics.jsonl is allowed.

    Returns:
      (resolved config, model_dir as a pathlib.Path)
    """
    from resnet_app.common import checkpoint
    from resnet_app.engine import loop
    from tests import runs

    root = tmp_path_factory.mktemp("tiny_run")
    resolved = runs.small_config(root, train_steps=4, eval_every=2, log_every=2)
    assert resolved.data.eval_examples == EVAL_EXAMPLES
    model_dir = root / "run"
    loop.train_and_evaluate(resolved, str(model_dir))
    assert [step for step, _ in checkpoint.list_checkpoints(str(model_dir))] == [2, 4]
    return resolved, model_dir


@pytest.fixture(scope="session")
def tiny_export(tiny_run, tmp_path_factory):
    """`tiny_run`'s latest checkpoint exported by `python -m resnet_app.export`: its directory."""
    import json

    from tests.commands import run_command

    _, model_dir = tiny_run
    export_dir = tmp_path_factory.mktemp("export") / "model"
    result = run_command(
        "resnet_app.export", f"--model_dir={model_dir}", f"--export_dir={export_dir}"
    )
    assert result.returncode == 0, result.stderr
    record = json.loads(result.stdout)
    assert record["checkpoint"] == "ckpt-4" and record["step"] == 4
    assert record["export_dir"] == str(export_dir)
    return export_dir


@pytest.fixture(scope="module")
def private_shapes_cache(tmp_path_factory):
    """The module's tests keep the `shapes` cache in a temporary folder, out of the user's home."""
    cache = tmp_path_factory.mktemp("cache")
    previous = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(cache)
    yield
    if previous is None:
        del os.environ["XDG_CACHE_HOME"]
    else:
        os.environ["XDG_CACHE_HOME"] = previous


@pytest.fixture(scope="module")
def matrix_datasets(tmp_path_factory):
    """(the root, {kind: --dataset value}) of the no-traceback matrix (tests/matrix.py)."""
    from tests import matrix

    root = tmp_path_factory.mktemp("matrix")
    return root, matrix.make_datasets(root)
