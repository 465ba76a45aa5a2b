"""scripts/time_to_accuracy.py: reading a run's way to the target (against sums worked
out by hand), what Keras `fit` reproduces of a recipe, and the script end to end."""

import json
import os
import sys

import pytest

from resnet_app import config
from tests.commands import REPO, error_line, run_command

sys.path.insert(0, os.path.join(REPO, "scripts"))

import keras_baseline  # noqa: E402
import run_timing  # noqa: E402

LAUNCHED = 1000.0


def events(input_wait=None):
    """Launched at 1000, the loop starts at 1010; 100 steps take 20 s the first time
    (10 s of them compiling) and 10 s after; each evaluation takes 2 s."""
    marks = [(100, 1030.0), (200, 1042.0), (300, 1054.0)]
    evals = [(100, 0.50, 1032.0), (200, 0.90, 1044.0), (300, 0.95, 1056.0)]
    records = [{"step": 0, "event": "start", "time": 1010.0}]
    for (step, time), (_, top1, end) in zip(marks, evals):
        mark = {"step": step, "time": time}
        if input_wait is not None:
            mark["input_wait"] = input_wait
        records += [mark, {"step": step, "top1": top1, "time": end, "seconds": 2.0}]
    return records


def test_the_crossing_and_where_the_time_went():
    timing = run_timing.timing(events(), LAUNCHED, 0.85, batch_size=32, examples=6400)
    assert timing.seconds == 44.0  # The end of the evaluation at step 200.
    assert timing.without_evals == 40.0  # Less the two evaluations up to it.
    assert (timing.step, timing.images, timing.epochs) == (200, 6400, 1.0)
    assert timing.startup == 10.0
    assert timing.compile == pytest.approx(10.0)  # 20 s for 100 steps at 0.1 s a step.
    assert timing.evaluation == 4.0
    assert timing.input is None  # Keras fit's events say nothing of its input.
    assert timing.steps == pytest.approx(20.0)  # 44 - 10 - 10 - 4.
    assert (timing.final_top1, timing.best_top1, timing.total) == (0.95, 0.95, 56.0)


def test_the_trainers_input_wait_is_its_share_of_each_interval():
    timing = run_timing.timing(events(input_wait=0.1), LAUNCHED, 0.85, 32, 6400)
    # Up to step 200: 0.1 of the first interval's 20 s and of the second's 10 s.
    assert timing.input == pytest.approx(3.0)
    assert timing.steps == pytest.approx(17.0)


def test_a_missed_target_reports_the_best_and_no_time():
    timing = run_timing.timing(events(), LAUNCHED, 0.99, 32, 6400)
    assert timing.seconds is None and timing.step is None and timing.epochs is None
    assert timing.best_top1 == 0.95
    assert timing.evaluation == 6.0  # All three, up to the end.
    faster = run_timing.timing(events(), LAUNCHED - 22.0, 0.85, 32, 6400)
    assert run_timing.speedup([faster], [timing]) is None


def test_the_speedup_is_a_ratio_of_medians():
    def at(launched):
        return run_timing.timing(events(), launched, 0.85, 32, 6400)

    ours = [at(LAUNCHED), at(LAUNCHED + 4), at(LAUNCHED - 100)]  # 44, 40 and 144 s.
    theirs = [at(LAUNCHED - 44), at(LAUNCHED - 56)]  # 88 and 100 s.
    assert run_timing.speedup(ours, theirs) == pytest.approx(94 / 44)
    assert run_timing.speedup(ours, theirs, "without_evals") == pytest.approx(90 / 40)


def test_fit_reproduces_the_quickstart_and_names_what_it_cannot():
    assert keras_baseline.unmirrored(config.resolve("configs/shapes_quickstart.yaml")) == []
    cutout = config.resolve(
        "configs/shapes_quickstart.yaml",
        sets=["data.augment.cutout_size=8", "train.label_smoothing=0.1"],
    )
    assert keras_baseline.unmirrored(cutout) == []
    other = config.resolve(
        "configs/shapes_quickstart.yaml",
        sets=[
            "train.ema_decay=0.99",
            "data.augment.randaugment_ops=2",
            "data.progressive.sizes=[16,24]",
            "data.progressive.epochs=[0,0.5]",
        ],
    )
    missing = keras_baseline.unmirrored(other)
    assert "train.ema_decay" in missing
    assert "data.augment.randaugment_ops" in missing
    assert any(key.startswith("data.progressive") for key in missing)
    resnet9 = keras_baseline.unmirrored(config.resolve("configs/cifar10_resnet9_fast.yaml"))
    assert any("fit here reads shapes" in key for key in resnet9)


def test_bad_flags_are_one_line_errors():
    line = error_line(run_command("scripts/time_to_accuracy.py", "--target=97"))
    assert "--target=97.0: give a test top-1 in (0, 1)" in line
    line = error_line(run_command("scripts/time_to_accuracy.py", "--runs=fit,keras"))
    assert "--runs: unknown keras" in line
    line = error_line(
        run_command(
            "scripts/time_to_accuracy.py",
            "--config=configs/cifar10_resnet18_modern.yaml",
            "--runs=fit,trainer",
        )
    )
    assert "the fit run does not reproduce" in line and "--runs=trainer,fast" in line


@pytest.mark.slow  # the benchmark script end to end
def test_the_script_times_fit_and_the_trainer_to_a_target(tmp_path):
    recipe = tmp_path / "tiny.yaml"
    recipe.write_text(
        "model: {name: tiny}\n"
        "data: {image_size: 16, train_examples: 512, eval_examples: 200,"
        " augment: {crop_padding: 2, cutout_size: 4}}\n"
        "schedule: {name: cosine, warmup_epochs: 0.5}\n"
        "train: {batch_size: 32, epochs: 2.1}\n"
    )
    result = run_command(
        "scripts/time_to_accuracy.py",
        f"--config={recipe}",
        f"--fast_config={recipe}",
        "--runs=fit,trainer",
        "--evals=3",
        "--target=0.01",
        f"--work_dir={tmp_path / 'runs'}",
        "--json",
        timeout=900,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)
    # 2.1 epochs of 512 at batch 32: 34 steps, rounded down to 33 for 3 evaluations.
    assert report["recipes"]["fit"]["steps"] == 33 and report["recipes"]["fit"]["eval_every"] == 11
    for run in ("fit", "trainer"):
        (timing,) = report["runs"][run]
        assert timing["step"] == 11 and timing["images"] == 352  # The first evaluation.
        assert 0 < timing["startup"] < timing["seconds"] <= timing["total"]
    fit_events = run_timing.read_events(tmp_path / "runs" / "fit_0" / "fit_events.jsonl")
    assert [e["step"] for e in fit_events if "top1" in e] == [11, 22, 33]
    trainer = run_timing.read_events(tmp_path / "runs" / "trainer_0" / "metrics.jsonl")
    assert [(e["step"], e["num_examples"]) for e in trainer if "top1" in e] == [
        (11, 200),
        (22, 200),
        (33, 200),
    ]
    (row,) = report["rows"]
    assert row["row"].startswith("1: trainer / fit") and row["ratio"] > 0


@pytest.mark.slow  # the benchmark script end to end
def test_fit_reads_the_trainers_images_prepared_alike():
    import numpy as np

    from resnet_app.data import input_pipeline
    from resnet_app.nets.presets import get_config

    resolved = config.resolve(
        "configs/shapes_quickstart.yaml",
        sets=["data.train_examples=96", "data.eval_examples=40", "train.seed=3"],
    )
    pipeline = input_pipeline.create_pipeline(
        resolved.data, default_image_size=get_config(resolved.model_name).default_image_size
    )
    train, test = keras_baseline.fit_datasets(resolved, pipeline)
    # The test split in order, resized to 24 px and normalized as the trainer evaluates it.
    images, labels = (np.concatenate(t) for t in zip(*[(x.numpy(), y.numpy()) for x, y in test]))
    batches = list(pipeline.eval_dataset(16))
    real = np.concatenate([b["mask"].numpy() for b in batches]) > 0
    theirs = np.concatenate([b["image"].numpy() for b in batches])[real]
    assert images.shape == theirs.shape == (40, 24, 24, 3)
    np.testing.assert_allclose(images, theirs, rtol=0, atol=1e-5)
    assert labels.tolist() == np.concatenate([b["label"].numpy() for b in batches])[real].tolist()
    # An epoch of training images (no augmentation in this recipe): the trainer's, reordered.
    seen = np.concatenate([x.numpy() for x, _ in train.take(3)])  # 3 batches of 32.
    trainer = np.concatenate([b["image"].numpy() for b in pipeline.train_dataset(32).take(3)])

    def order(batch):  # By the values to 3 decimals: the same images sort alike.
        return batch[np.lexsort(np.round(batch.reshape(len(batch), -1), 3).T[::-1])]

    np.testing.assert_allclose(order(seen), order(trainer), rtol=0, atol=1e-5)
