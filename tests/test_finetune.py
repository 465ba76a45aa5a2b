"""Fine-tuning runs: another run's weights, a new head, frozen parts, resume, export."""

import os
import shutil

import numpy as np
import pytest
import tensorflow as tf

from resnet_app.common import checkpoint
from resnet_app.common.errors import ConfigError
from resnet_app.data import run_pipeline, shapes
from resnet_app.data import sources as data_sources
from resnet_app.engine import loop, setup
from resnet_app.nets import parts
from resnet_app.pretrained import run_files
from tests import runs
from tests.commands import error_line, run_command
from tests.tfds_mock import closed_port

# Training runs and subprocesses; `train.deterministic` runs in this process.
pytestmark = pytest.mark.usefixtures("op_determinism_off_after")
CLASSES = (5, 6, 7)


def write_folder(root, data_dir, per_class=(8, 6)):
    """A `folder:` dataset of three shapes classes unseen by the source (PNG files)."""
    source = data_sources.load_shapes(str(data_dir), 400, 200)
    for split, count in zip(("train", "test"), per_class, strict=True):
        images, labels = source.split(split).images, source.split(split).labels
        for label in CLASSES:
            directory = root / split / shapes.CLASS_NAMES[label]
            directory.mkdir(parents=True)
            for i, index in enumerate(np.flatnonzero(labels == label)[:count]):
                tf.io.write_file(str(directory / f"{i}.png"), tf.io.encode_png(images[index]))
    return f"folder:{root}"


def finetune_config(tmp_path, source_dir, *sets, **train):
    folder = write_folder(tmp_path / "folder", tmp_path / "data")
    return runs.small_config(
        tmp_path,
        f"data.dataset={folder}",
        "data.train_examples=null",
        "data.eval_examples=null",
        "train.batch_size=8",
        *sets,
        init_from=str(source_dir),
        **train,
    )


def source_weights(model_dir):
    return run_files.read(checkpoint.find_latest(str(model_dir))[1]).layers


def test_a_run_starts_from_another_runs_weights_and_nothing_else(tiny_run, tmp_path):
    _, source_dir = tiny_run
    run = setup.build_run(
        finetune_config(tmp_path, source_dir, train_steps=4), str(tmp_path / "ft")
    )
    run.restore(None)
    expected, loaded = source_weights(source_dir), parts.get_weights(run.model)
    for layer, variables in loaded.items():
        for name, value in variables.items():
            if layer == "logits":  # 10 classes there, 3 here: a new head.
                assert value.shape[-1] == 3 and expected[layer][name].shape[-1] == 10
            else:
                np.testing.assert_array_equal(value, expected[layer][name])
    assert int(run.global_step.numpy()) == 0 and int(run.data_position.numpy()) == 0
    assert all(not np.any(slot.numpy()) for slot in run.optimizer.slots[0])
    # The source's preprocessing, as its run recorded it.
    _, recorded = run_pipeline.read_data_info(str(source_dir))
    assert run.pipeline.preprocessing.mean == tuple(recorded.mean)
    assert run.config.data.mean == tuple(recorded.mean)


def test_frozen_parts_and_their_statistics_stay_fixed(tiny_run, tmp_path):
    _, source_dir = tiny_run
    config = finetune_config(tmp_path, source_dir, "train.freeze=[stem]", train_steps=3)
    result = loop.train_and_evaluate(config, str(tmp_path / "frozen"))
    before, after = source_weights(source_dir), parts.get_weights(result.model)
    for name in ("kernel",):
        np.testing.assert_array_equal(after["stem_conv"][name], before["stem_conv"][name])
    for name, value in after["stem_bn"].items():  # gamma, beta and the moving statistics.
        np.testing.assert_array_equal(value, before["stem_bn"][name])
    assert not np.array_equal(
        after["stage1_unit0_conv1"]["kernel"], before["stage1_unit0_conv1"]["kernel"]
    )

    shutil.rmtree(tmp_path / "folder")
    config = finetune_config(
        tmp_path, source_dir, "train.freeze=[stem]", "train.freeze_batch_norm=false", train_steps=3
    )
    result = loop.train_and_evaluate(config, str(tmp_path / "frozen_bn_trains"))
    after = parts.get_weights(result.model)
    for name in ("gamma", "beta"):
        np.testing.assert_array_equal(after["stem_bn"][name], before["stem_bn"][name])
    assert not np.array_equal(after["stem_bn"]["moving_mean"], before["stem_bn"]["moving_mean"])


def test_resume_continues_from_its_own_checkpoints_not_the_source(tiny_run, tmp_path):
    _, tiny_dir = tiny_run
    source_dir = tmp_path / "source"
    shutil.copytree(tiny_dir, source_dir)
    # A constant rate: the halves lengthened on resume compare with the whole.
    sets = ("train.deterministic=true", "train.lr_multipliers={head: 5}", "schedule.name=constant")
    whole = loop.train_and_evaluate(
        finetune_config(tmp_path, source_dir, *sets, train_steps=4), str(tmp_path / "whole")
    )
    shutil.rmtree(tmp_path / "folder")
    config = finetune_config(tmp_path, source_dir, *sets, train_steps=2)
    loop.train_and_evaluate(config, str(tmp_path / "halves"))
    shutil.rmtree(source_dir)  # Gone: a resumed run does not read it.
    resumed = loop.train_and_evaluate(_with_steps(config, 4), str(tmp_path / "halves"))
    for a, b in zip(whole.model.weights, resumed.model.weights, strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    other = tmp_path / "other"
    shutil.copytree(tiny_dir, other)
    changed = _with_steps(config, 6, init_from=str(other))
    with pytest.raises(ConfigError, match=r"cannot resume .*train.init_from"):
        loop.train_and_evaluate(changed, str(tmp_path / "halves"))


def _with_steps(config, steps, **train):
    import dataclasses

    return dataclasses.replace(
        config, train=dataclasses.replace(config.train, train_steps=steps, **train)
    )


def test_a_finetuned_run_exports_its_classes_and_the_sources_preprocessing(tiny_run, tmp_path):
    _, source_dir = tiny_run
    model_dir = tmp_path / "ft"
    loop.train_and_evaluate(
        finetune_config(tmp_path, source_dir, train_steps=4, eval_every=4), str(model_dir)
    )
    final = [r for r in runs.read_records(model_dir) if r.get("split") == "test"][-1]
    export_dir = tmp_path / "export"
    result = run_command(
        "resnet_app.export", f"--model_dir={model_dir}", f"--export_dir={export_dir}"
    )
    assert result.returncode == 0, result.stderr
    model = tf.saved_model.load(str(export_dir))
    signature = model.signatures["serving_default"]
    correct = total = 0
    for label in CLASSES:
        directory = tmp_path / "folder" / "test" / shapes.CLASS_NAMES[label]
        for file in sorted(os.listdir(directory)):
            image = tf.io.decode_png(tf.io.read_file(str(directory / file)))
            out = signature(images=image[None])
            names = [name.decode() for name in out["top_k_names"].numpy()[0]]
            correct += names[0] == shapes.CLASS_NAMES[label]
            total += 1
    assert total == final["num_examples"]
    assert correct / total == pytest.approx(final["top1"], abs=1e-9)
    _, recorded = run_pipeline.read_data_info(str(source_dir))
    _, exported = run_pipeline.read_data_info(str(model_dir))
    assert exported.mean == recorded.mean and exported.std == recorded.std


def test_bad_fine_tuning_settings_are_one_line(tiny_run, tmp_path):
    """The command refuses in one line (one process: the line itself); the library
    raises the same errors for the other mistakes, checked in this process."""
    _, source_dir = tiny_run
    offline = {"KERAS_HOME": str(tmp_path / "keras"), data_sources.NETWORK_PROBE_ENV: closed_port()}
    result = run_command(
        "resnet_app.train",
        "--dataset=synthetic",
        f"--model_dir={tmp_path / 'keras'}",
        "--train_steps=1",
        "--init_from=keras:resnet50",
        "--model=resnet50",
        "--set",
        "data.image_size=32",
        env=offline,
    )
    assert "_notop.h5 is not in" in error_line(result)
    cases = {
        "missing": ("/no/such/weights.safetensors", ["train.freeze=[]"], "no such file"),
        "part": (str(source_dir), ["train.freeze=[stem,stage7]"], "names part 'stage7'"),
        "arch": (str(source_dir), ["model.name=resnet20"], "has 1 stages, resnet20 has 3"),
    }
    for name, (source, sets, message) in cases.items():
        with pytest.raises(ConfigError, match=message):
            config = runs.small_config(tmp_path / name, *sets, init_from=source, train_steps=1)
            run = setup.build_run(config, str(tmp_path / name / "run"))
            run.restore(None)


@pytest.mark.parametrize("mode", ["allreduce", "model_average"])
def test_every_tower_starts_from_the_source_and_frozen_parts_stay(tiny_run, tmp_path, mode):
    _, source_dir = tiny_run
    expected = source_weights(source_dir)
    config = finetune_config(
        tmp_path,
        source_dir,
        f"sync.mode={mode}",
        "train.freeze=[stem]",
        train_steps=2,
        num_towers=2,
    )
    run = setup.build_run(config, str(tmp_path / "towers"))
    run.restore(None)
    named = parts.named_layers(run.model)
    for layer in ("stem_conv", "stem_bn", "stage1_unit0_conv1", "stage1_unit0_bn2"):
        for variable in named[layer].weights:
            copies = run.strategy.experimental_local_results(variable.value)
            assert len(copies) == 2
            for copy in copies:
                np.testing.assert_array_equal(
                    copy.numpy(), expected[layer][parts.short_name(variable)]
                )
    trained = loop.train(run).model
    after = parts.get_weights(trained)
    for name, value in after["stem_bn"].items():
        np.testing.assert_array_equal(value, expected["stem_bn"][name])
    np.testing.assert_array_equal(after["stem_conv"]["kernel"], expected["stem_conv"]["kernel"])
