"""The in-memory copy of the last completed step: whole steps only, put back exactly."""

import numpy as np
import pytest
import tensorflow as tf

from resnet_app.common import distribute
from resnet_app.engine.last_step import LastStep


def _variables():
    return [tf.Variable(np.arange(4.0, dtype=np.float32)), tf.Variable(np.int64(0))]


def _step(variables, last, after_fn):
    """One "step": both variables updated, then the copy committed behind `after_fn()`."""

    @tf.function
    def step():
        variables[0].assign_add(tf.ones([4]))
        variables[1].assign_add(1)
        last.commit(after=[after_fn()])

    step()


def test_the_copy_is_the_last_step_whose_barrier_passed():
    strategy = tf.distribute.get_strategy()
    variables = _variables()
    last = LastStep(strategy, variables)
    last.commit_now(10)
    ok = lambda: tf.constant(0.0)  # noqa: E731
    _step(variables, last, ok)
    _step(variables, last, ok)
    assert int(last.step.numpy()) == 12

    def failing():  # A collective that fails after the step's updates went through.
        return tf.debugging.assert_less(variables[0][0], -1.0, message="peer lost")

    with pytest.raises(tf.errors.InvalidArgumentError):
        _step(variables, last, failing)
    # The live variables moved on a third time, half-way through a step as far
    # as the run knows; the copy still holds step 12.
    np.testing.assert_array_equal(variables[0].numpy(), np.arange(4.0) + 3)
    assert last.restore() == 12
    np.testing.assert_array_equal(variables[0].numpy(), np.arange(4.0) + 2)
    assert int(variables[1].numpy()) == 2


class _Averaging:
    """Averages every 3 steps, counted by its own variable (the optimizer's iterations)."""

    interval = 3

    def __init__(self):
        self.iterations = tf.Variable(np.int64(0))

    def at_average(self):
        return tf.equal(self.iterations % self.interval, 0)


def test_with_model_averaging_the_copy_is_the_last_average():
    averaging = _Averaging()
    variables = [tf.Variable(0.0)]
    last = LastStep(tf.distribute.get_strategy(), variables, averaging)
    last.commit_now(0)

    @tf.function
    def step():
        variables[0].assign_add(1.0)
        averaging.iterations.assign_add(1)
        last.commit(after=[tf.constant(0.0)])

    for _ in range(5):
        step()
    assert last.restore() == 3  # Steps 4 and 5 come after the last average.
    assert float(variables[0].numpy()) == 3.0


def test_every_replica_copy_is_kept():
    devices = [d.name for d in tf.config.list_logical_devices("CPU")[:2]]
    strategy = distribute.mirrored_strategy(devices)  # Its own collective keys.
    with strategy.scope():
        variable = tf.Variable(1.0, synchronization=tf.VariableSynchronization.ON_READ)
    last = LastStep(strategy, [variable])
    for index, local in enumerate(strategy.experimental_local_results(variable)):
        local.assign(float(index + 5))
    last.commit_now(7)
    for local in strategy.experimental_local_results(variable):
        local.assign(0.0)
    assert last.restore() == 7
    assert [float(v.numpy()) for v in strategy.experimental_local_results(variable)] == [5.0, 6.0]
