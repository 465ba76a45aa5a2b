"""Speed features of the trainer: mixed precision, XLA, and input-bound detection.

(Their speed is measured by scripts/benchmark.py, not here: timed tests on a
shared machine are noise. These tests check that each feature does what it
says.)
"""

import numpy as np
import pytest
import tensorflow as tf

from resnet_app.common.errors import ConfigError
from resnet_app.engine import loop, setup
from tests import runs
from tests.commands import run_command
from tests.runs import read_records


def small_config(tmp_path, *sets, **train):
    """`runs.small_config`, evaluating only at the end."""
    return runs.small_config(tmp_path, "train.eval_every=100", *sets, **train)


@pytest.mark.parametrize("precision,compute", [("bf16", "bfloat16"), ("fp16", "float16")])
def test_mixed_precision_trains_with_float32_weights_and_logits(tmp_path, precision, compute):
    resolved = small_config(tmp_path, f"train.precision={precision}", train_steps=4)
    assert resolved.data.dtype == compute  # The images follow the precision.
    result = loop.train_and_evaluate(resolved, str(tmp_path / "run"))
    model = result.model
    assert model.stem_conv.compute_dtype == compute
    assert model.logits.compute_dtype == "float32"
    assert all(w.dtype == np.float32 and np.all(np.isfinite(w)) for w in model.get_weights())
    assert np.isfinite(result.summary["train_loss"])
    reader = tf.train.load_checkpoint(str(tmp_path / "run" / "ckpt-4"))
    scale_saved = any("dynamic_scale" in n for n in reader.get_variable_to_shape_map())
    assert scale_saved == (precision == "fp16")  # fp16 scales the loss; bf16 need not.
    # The policy was only for building the model.
    assert tf.keras.mixed_precision.global_policy().name == "float32"
    # Evaluated at the run's precision, and the record says so.
    (record,) = [r for r in read_records(tmp_path / "run") if "top1" in r]
    assert record["precision"] == precision and result.summary["precision"] == precision


def test_evaluate_measures_a_bf16_checkpoint_as_the_trainer_did(tmp_path):
    """One checkpoint, one number: `python -m resnet_app.evaluate` builds the model at
    the run's precision, as the trainer evaluated it, and says so."""
    model_dir = tmp_path / "run"
    loop.train_and_evaluate(
        small_config(tmp_path, "train.precision=bf16", train_steps=2), str(model_dir)
    )
    result = run_command("resnet_app.evaluate", f"--model_dir={model_dir}")
    assert result.returncode == 0, result.stderr[-3000:]
    trained, evaluated = [r for r in read_records(model_dir) if "top1" in r]
    assert evaluated["event"] == "evaluation" and evaluated["checkpoint"] == "ckpt-2"
    assert trained["precision"] == evaluated["precision"] == "bf16"
    assert evaluated["num_examples"] == trained["num_examples"] == 37
    assert evaluated["top1"] == trained["top1"] and evaluated["top5"] == trained["top5"]
    assert evaluated["loss"] == pytest.approx(trained["loss"], rel=1e-6)


def test_xla_with_synchronized_batch_norm_on_towers_is_refused(tmp_path):
    resolved = small_config(tmp_path, "train.jit=true", "model.bn_synchronized=true", num_towers=2)
    with pytest.raises(ConfigError, match="train.jit cannot compile model.bn_synchronized"):
        setup.build_run(resolved, str(tmp_path / "run"))


def test_xla_run_trains(tmp_path):
    result = loop.train_and_evaluate(
        small_config(tmp_path, "train.jit=true", train_steps=3), str(tmp_path / "run")
    )
    assert np.isfinite(result.summary["train_loss"])


def slow_down(pipeline):
    """Makes each of `pipeline`'s training batches take 200 ms more.

    200 ms per batch: far slower than the tiny network's step, even on a
    machine busy with another test process. (The pipeline object itself is
    kept: a proxy with `__getattr__` confuses autograph when the trainer
    builds the dataset inside a traced function.)
    """
    train_dataset = pipeline.train_dataset

    def wait(batch):
        done = tf.py_function(lambda: __import__("time").sleep(0.2) or 0, [], tf.int32)
        with tf.control_dependencies([done]):
            return {k: tf.identity(v) for k, v in batch.items()}

    def slow_train_dataset(*args, **kwargs):
        return train_dataset(*args, **kwargs).map(wait)

    pipeline.train_dataset = slow_train_dataset


def test_a_slow_input_pipeline_is_reported_once(tmp_path):
    model_dir = tmp_path / "run"
    run = setup.build_run(
        small_config(tmp_path, "train.log_every=3", train_steps=12), str(model_dir)
    )
    slow_down(run.pipeline)
    loop.train(run)
    records = read_records(model_dir)
    waits = [r["input_wait"] for r in records if "accuracy" in r]
    assert len(waits) == 4 and min(waits[1:]) > 0.5, waits
    events = [r for r in records if r.get("event") == "input_bound"]
    assert [e["step"] for e in events] == [6]  # After a first interval of warm-up; once.
