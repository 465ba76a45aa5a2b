"""Each run writes its settings to TensorBoard's HParams plugin, beside its final metrics.

Read back with TensorBoard's own parsers, and compared with the config the run
was given.
"""

import glob
import os

import pytest
from tensorboard.backend.event_processing import event_accumulator
from tensorboard.plugins.hparams import metadata
from tensorboard.util import tensor_util

from resnet_app.common import metrics
from tests.runs import read_records


def _session_hparams(model_dir):
    """{name: value} of the session start info in the run directory's own event files."""
    found = []
    for path in glob.glob(os.path.join(model_dir, "events.out.tfevents.*")):
        accumulator = event_accumulator.EventAccumulator(path)
        accumulator.Reload()
        for tag in accumulator.summary_metadata:
            content = accumulator.SummaryMetadata(tag).plugin_data
            if (
                content.plugin_name == metadata.PLUGIN_NAME
                and tag == metadata.SESSION_START_INFO_TAG
            ):
                info = metadata.parse_session_start_info_plugin_data(content.content)
                found.append(info)
    assert len(found) == 1, found
    (info,) = found
    values = {}
    for name, value in info.hparams.items():
        kind = value.WhichOneof("kind")
        values[name] = getattr(value, kind)
    return info, values


def test_the_run_is_one_session_with_its_settings(tiny_run):
    resolved, model_dir = tiny_run
    info, values = _session_hparams(model_dir)
    assert info.group_name == "run" or info.group_name.endswith("run")
    assert values["model.name"] == resolved.model.name
    assert values["data.dataset"] == resolved.data.dataset
    assert values["train.batch_size"] == resolved.train.batch_size
    assert values["train.seed"] == resolved.train.seed
    assert values["optimizer.learning_rate"] == pytest.approx(resolved.optimizer.learning_rate)
    assert values["data.augment.flip"] == resolved.data.augment.flip
    assert values["total_steps"] == 4
    # Every setting of the config is there, under its dotted name.
    assert set(metrics.hparam_values(resolved.to_dict(with_derived=True))) <= set(values)


def test_the_final_metrics_are_the_sessions_eval_scalars(tiny_run):
    _, model_dir = tiny_run
    [path] = glob.glob(os.path.join(model_dir, "eval", "events.out.tfevents.*"))
    accumulator = event_accumulator.EventAccumulator(path, size_guidance={"tensors": 0})
    accumulator.Reload()
    final = [r for r in read_records(model_dir) if "top1" in r and "event" not in r][-1]
    top1 = accumulator.Tensors("top1")[-1]
    assert top1.step == final["step"]
    assert float(tensor_util.make_ndarray(top1.tensor_proto)) == pytest.approx(
        final["top1"], abs=1e-6
    )


def test_values_are_flattened_to_scalars():
    tree = {"a": {"b": 1, "c": {"d": True}}, "e": [1, 2], "f": None, "g": "x", "h": 0.5}
    assert metrics.hparam_values(tree) == {
        "a.b": 1,
        "a.c.d": True,
        "e": "[1, 2]",
        "f": "null",
        "g": "x",
        "h": 0.5,
    }
