"""Readers of a run that is still training: a checkpoint rotated out (or a best replaced)
between its choice and its restore is chosen again, or named as gone, never
reported as "another model" (`checkpoint.restore_selected`)."""

from __future__ import annotations

import os

import numpy as np
import pytest
import tensorflow as tf

from resnet_app.common import checkpoint, run_dir
from resnet_app.common.errors import ConfigError


def network():
    return tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(2)])


class Trainer:
    """Saves checkpoints of a small network whose weights are the step, as a trainer would."""

    def __init__(self, directory, keep=2):
        self.directory = str(directory)
        self.model = network()
        self.saved = checkpoint.RunCheckpoint(self.directory, max_to_keep=keep, model=self.model)

    def save(self, step):
        for variable in self.model.variables:
            variable.assign(tf.fill(variable.shape, float(step)))
        return self.saved.save(step)


def restored_step(model) -> float:
    values = {float(v) for variable in model.variables for v in variable.numpy().ravel()}
    assert len(values) == 1
    return values.pop()


def test_latest_rotated_out_before_its_restore_is_chosen_again(tmp_path):
    trainer = Trainer(tmp_path, keep=2)
    trainer.save(1)
    trainer.save(2)
    [(step, prefix)] = checkpoint.select(trainer.directory, "latest")
    assert step == 2
    trainer.save(3)
    trainer.save(4)  # ckpt-2 rotated out: the reader's choice is gone.
    assert not os.path.exists(prefix + ".index")
    reader = network()
    found = checkpoint.restore_selected(reader, trainer.directory, "latest", step, prefix)
    assert found == (4, os.path.join(trainer.directory, "ckpt-4"), "raw")
    assert restored_step(reader) == 4.0


def test_a_named_checkpoint_rotated_out_is_named_as_gone_not_as_another_model(tmp_path):
    trainer = Trainer(tmp_path, keep=1)
    trainer.save(1)
    [(step, prefix)] = checkpoint.select(trainer.directory, "ckpt-1")
    trainer.save(2)
    with pytest.raises(ConfigError) as raised:
        checkpoint.restore_selected(network(), trainer.directory, "ckpt-1", step, prefix)
    message = str(raised.value)
    assert "--checkpoint=ckpt-1: not in" in message and "one of: ckpt-2" in message
    assert "does not match" not in message


def test_for_all_a_checkpoint_gone_is_its_own_error_to_skip(tmp_path):
    trainer = Trainer(tmp_path, keep=3)
    for step in (1, 2, 3):
        trainer.save(step)
    chosen = checkpoint.select(trainer.directory, "all")
    trainer.save(4)  # ckpt-1 rotated out.
    reader = network()
    with pytest.raises(checkpoint.CheckpointGoneError, match="ckpt-1 was removed before"):
        checkpoint.restore_selected(reader, trainer.directory, "all", *chosen[0])
    for step, prefix in chosen[1:]:
        found = checkpoint.restore_selected(reader, trainer.directory, "all", step, prefix)
        assert found[0] == step
        assert restored_step(reader) == step


def test_a_best_replaced_before_its_restore_is_chosen_again(tmp_path):
    trainer = Trainer(tmp_path, keep=3)
    trainer.save(1)
    checkpoint.keep_best(trainer.directory, 1, {"metric": "top1", "value": 0.5})
    [(step, prefix)] = checkpoint.select(trainer.directory, run_dir.BEST_CHOICE)
    trainer.save(2)
    checkpoint.keep_best(trainer.directory, 2, {"metric": "top1", "value": 0.7})
    reader = network()
    found = checkpoint.restore_selected(reader, trainer.directory, "best", step, prefix)
    assert found[0] == 2 and found[1].endswith(os.path.join("best", "best-2"))
    assert restored_step(reader) == 2.0


def test_a_checkpoint_of_another_model_is_still_told_as_such(tmp_path):
    trainer = Trainer(tmp_path)
    prefix = trainer.save(1)
    other = tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(5)])
    with pytest.raises(ConfigError, match="does not match the model") as raised:
        checkpoint.restore_selected(other, trainer.directory, "latest", 1, prefix)
    assert not isinstance(raised.value, checkpoint.CheckpointGoneError)
    np.testing.assert_array_equal(trainer.model.variables[1].numpy(), [1.0, 1.0])
