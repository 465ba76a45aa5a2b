"""Model averaging (local SGD): replicas train alone and average every K steps.

`--sync=model_average --average_interval=K` (config `sync.mode`,
`sync.interval`) replaces the per-step gradient all-reduce, the TF2 form of
TF1's `tf.contrib.opt.ModelAverageOptimizer`:

- Every replica (tower or worker device) holds its own copy of every model
  variable and optimizer slot. Between averages a replica updates only its
  copy, from the gradient of the mean loss over its own share of the batch
  (plus the whole regularization penalty): no gradient leaves the replica.
- Whenever `interval` divides the local step count (`optimizer.iterations`,
  the same on every replica), one all-reduce replaces every copy by the mean
  over all replicas of: the weights, the BatchNorm moving statistics and the
  optimizer slots (momentum, Adam's moments). The iteration count and the
  learning rate are not averaged: they are the same on every replica, set
  from outside.
- Every copy starts from the same values: the strategy initializes each
  replica's copy from the first one's (and from the chief's across workers),
  and a restore writes one saved value into every copy.

So K=1 is the all-reduce update whenever the update is linear in the
gradient (SGD and momentum: averaging the replicas' weights and momenta after
one local step each is the step on their summed gradient), and larger K
trades that traffic, one all-reduce of the weights and slots every K steps,
for replicas that drift apart in between.

How: `local_variables()` is a variable creator, entered inside
`strategy.scope()` while the model and optimizer are built. It makes every
variable a `SyncOnReadVariable`: in replica context a read or an update
touches the replica's copy only; read across replicas (a checkpoint, Keras's
`get_weights`), a weight or slot gives the mean over the replicas
(aggregation MEAN), the iteration count and learning rate the first copy
(ONLY_FIRST_REPLICA); an assignment across replicas writes every copy.
`ModelAveraging.apply_locally` applies a replica's own gradients with the
optimizer's update rule; Keras's `apply_gradients` would all-reduce them
first. Per-step metrics are still summed across replicas (4 numbers): that
is how every worker learns at the same step that the loss went non-finite.

Checkpoints, evaluation and the trained model see the global (averaged)
model: the trainer evaluates and saves only right after an average, so every
copy holds the same values and the checkpoint (which stores the MEAN of the
copies) holds exactly the state the run goes on from. Resuming from it is
exact: nothing of the local drift is lost, because there is none at that
step. See `sync.py` for how evaluations, checkpoints and stops are moved
to averages.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import keras
import tensorflow as tf

from resnet_app.common import compat, distribute

ON_READ = tf.VariableSynchronization.ON_READ
MEAN = tf.VariableAggregation.MEAN
ONLY_FIRST_REPLICA = tf.VariableAggregation.ONLY_FIRST_REPLICA


def _replica_local_creator(next_creator, **kwargs):
    """Makes a variable with one independent copy per replica (see the module docstring)."""
    kwargs["synchronization"] = ON_READ
    dtype = kwargs.get("dtype")
    floating = dtype is None or tf.as_dtype(dtype).is_floating
    # The iteration count and learning rate (Keras asks ONLY_FIRST_REPLICA for
    # them) are the same everywhere; a mean of integers would be a float.
    if kwargs.get("aggregation") != ONLY_FIRST_REPLICA and floating:
        kwargs["aggregation"] = MEAN
    else:
        kwargs["aggregation"] = ONLY_FIRST_REPLICA
    return next_creator(**kwargs)


@contextlib.contextmanager
def local_variables() -> Iterator[None]:
    """Variables created inside get one independent copy per replica.

    Enter it inside `strategy.scope()`, around building the model and the
    optimizer (and `optimizer.build`), and nowhere else.
    """
    with tf.variable_creator_scope(_replica_local_creator):
        yield


class ModelAveraging:
    """The local update and the periodic average of a model built in `local_variables()`.

    Args:
      model: built in `strategy.scope()` and `local_variables()`.
      optimizer: created and built there too.
      strategy: the strategy.
      interval: average every this many steps (1 or more).

    Raises:
      ValueError: for variables not made by `local_variables()`, or an
        optimizer option whose state this does not average (EMA, gradient
        accumulation, loss scaling).
    """

    def __init__(
        self,
        model: keras.Model,
        optimizer: keras.optimizers.Optimizer,
        strategy: tf.distribute.Strategy,
        interval: int,
    ):
        if interval < 1:
            raise ValueError(f"interval must be 1 or more, got {interval}")
        if optimizer.use_ema or optimizer.gradient_accumulation_steps:
            raise ValueError("model averaging does not average EMA or gradient accumulators")
        if optimizer.loss_scale_factor is not None or isinstance(
            optimizer, keras.optimizers.LossScaleOptimizer
        ):
            raise ValueError("model averaging does not apply a loss scale")
        self.model = model
        self.optimizer = optimizer
        self.strategy = strategy
        self.interval = interval
        variables = [*model.variables, *optimizer.variables]
        not_local = [v.path for v in variables if v.value.synchronization != ON_READ]
        if not_local:
            raise ValueError(f"not created in averaging.local_variables(): {not_local[:3]}")
        # The weights, BatchNorm statistics and optimizer slots (MEAN); not the
        # iteration count and learning rate (ONLY_FIRST_REPLICA).
        self.averaged = [v for v in variables if getattr(v.value, "aggregation", MEAN) == MEAN]
        self._average = tf.function(self._average_fn)

    def apply_locally(self, gradients: list[tf.Tensor], variables: list) -> None:
        """In replica context: this replica's update of its own copy, no communication.

        What `optimizer.apply_gradients` does (clipping, decoupled weight
        decay, the update rule, the iteration count), minus the all-reduce of
        the gradients.
        """
        optimizer = self.optimizer
        gradients = compat.clip_gradients(optimizer, gradients)
        # The base class's decay works on the replica's copy; the TF backend's
        # would merge into cross-replica context.
        compat.apply_weight_decay_locally(optimizer, variables)
        learning_rate = optimizer.learning_rate
        for gradient, variable in zip(gradients, variables):
            optimizer.update_step(gradient, variable, learning_rate)
        optimizer.iterations.assign_add(1)

    def at_average(self) -> tf.Tensor:
        """Whether `interval` divides the step: the copies are averaged (or never differed)."""
        step = tf.convert_to_tensor(self.optimizer.iterations)
        return tf.equal(step % tf.cast(self.interval, step.dtype), 0)

    def _replica_average(self) -> None:
        distribute.assign_replica_mean(self.averaged)  # Each replica's copies, averaged.

    def _average_fn(self) -> None:
        self.strategy.run(self._replica_average)

    def average_if_due(self) -> None:
        """In cross-replica context, after a step: averages when `interval` divides the step."""
        if self.interval == 1:
            self.strategy.run(self._replica_average)
        else:
            tf.cond(self.at_average(), self._average_fn, lambda: None)

    def average(self) -> None:
        """Averages now, called eagerly in cross-replica context (the end of a run)."""
        self._average()
