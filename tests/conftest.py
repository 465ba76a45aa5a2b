"""Session setup: the tiers (tests/tiers.py), and the CPU split into 3 logical devices at import,
before TensorFlow initializes its devices, so that tests can run towers on any machine."""

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
    """Marks `integration` (tests/tiers.py) and `slow` (tests/slow_tier.py), before `-m` selects.

    The tests sharing what their module keeps are one `xdist_group`, so it is built once. The
    other tests that start processes or run towers are one group too: they run one at a time,
    so no two processes contend for the cores, and towers, whose replicas meet at every
    collective, never wait on another process's threads. The rest go to any free worker.
    """
    from tests import slow_tier, tiers

    analysis, collected = tiers.Analysis(), {}
    grouped = tiers.Analysis({**tiers.PROCESSES, **tiers.TOWERS})
    for item in items:
        reason = analysis.item(item)
        if reason:
            item.add_marker(pytest.mark.integration(reason=reason))
        nodeid, callspec = item.nodeid.removeprefix("tests/"), getattr(item, "callspec", None)
        slow = collected[nodeid] = slow_tier.reason(nodeid, getattr(callspec, "params", {}))
        if slow:
            item.add_marker(pytest.mark.slow(reason=slow))
        if tiers.shares_module_state(item):
            item.add_marker(pytest.mark.xdist_group(item.module.__name__))
        elif grouped.item(item):
            item.add_marker(pytest.mark.xdist_group(PROCESS_GROUP))
    problems = slow_tier.check(collected)
    if problems:
        raise pytest.UsageError("\n".join(problems))
    # The files with the most integration tests first, so that the light ones fill the end.
    heavy = collections.Counter(i.module.__name__ for i in items if "integration" in i.keywords)
    items.sort(key=lambda item: -heavy[item.module.__name__])
    if config.getoption("--fast"):
        config.hook.pytest_deselected(items=[i for i in items if "integration" in i.keywords])
        items[:] = [item for item in items if "integration" not in item.keywords]


def _guarded(item):
    from tests import tiers

    return contextlib.nullcontext() if "integration" in item.keywords else tiers.guard(item.nodeid)


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
    """`train.deterministic` turns op determinism on for the whole process: off after the test."""
    yield
    from tensorflow.python.framework import config as tf_config

    tf_config.disable_op_determinism()


EVAL_EXAMPLES = 37  # Not a multiple of any batch size used in tests: the last batch is padded.


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory):
    """(resolved config, model_dir): a 4-step tiny run on 64 `shapes` images, checkpoints at
    steps 2 and 4. Tests that change the run directory work on a copy; appending to its
    metrics.jsonl is allowed."""
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
    """The module's `shapes` cache in a temporary folder, out of the user's home."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("cache")))
        yield


@pytest.fixture(scope="module")
def matrix_datasets(tmp_path_factory):
    """(the root, {kind: --dataset value}) of the no-traceback matrix (tests/matrix.py)."""
    from tests import matrix

    root = tmp_path_factory.mktemp("matrix")
    return root, matrix.make_datasets(root)
