"""Tests of the optimizers against NumPy implementations of their update rules.

The references are float64 NumPy written from the published rules (TF1's
`MomentumOptimizer` kernel, the update rules in the Keras 3 docstrings), not from
optim.py. Variables are float64 so that rtol=1e-6 holds over several steps; the
only float32 number is the learning rate, which Keras keeps in a float32 variable,
so the references round it the same way (`f32`).
"""

import re

import keras
import numpy as np
import pytest
import tensorflow as tf

from resnet_app.common.distribute import mirrored_strategy
from resnet_app.common.errors import ConfigError
from resnet_app.engine import large_batch, optim

RTOL = 1e-6
STEPS = 6
DROP_AT = 3  # The learning rate drops 10x before this step.
LEARNING_RATES = [0.1] * DROP_AT + [0.01] * (STEPS - DROP_AT)

_rng = np.random.default_rng(0)
W0 = _rng.normal(size=3)
GRADIENTS = _rng.normal(size=(STEPS, 3))
REPLICA_TARGETS = _rng.normal(size=(2, 3))


def f32(value: float) -> float:
    """`value` as the optimizer's float32 learning-rate variable holds it."""
    return float(np.float32(value))


# NumPy references. Each returns the variable after every step, shape (steps, ...).


def tf1_momentum(w, gradients, learning_rates, momentum, nesterov):
    """TF1 ApplyMomentum: accum = m * accum + g; w -= lr * accum (or lr * (g + m * accum))."""
    accumulator = np.zeros_like(w)
    trajectory = []
    for gradient, lr in zip(gradients, learning_rates):
        gradient = gradient(w) if callable(gradient) else gradient
        accumulator = momentum * accumulator + gradient
        step = gradient + momentum * accumulator if nesterov else accumulator
        w = w - f32(lr) * step
        trajectory.append(w)
    return np.array(trajectory)


def keras_sgd(w, gradients, learning_rates, momentum, nesterov):
    """Keras 3 SGD: v = m * v - lr * g; w += v (or w += m * v - lr * g)."""
    velocity = np.zeros_like(w)
    trajectory = []
    for gradient, lr in zip(gradients, learning_rates):
        velocity = momentum * velocity - f32(lr) * gradient
        w = w + (momentum * velocity - f32(lr) * gradient if nesterov else velocity)
        trajectory.append(w)
    return np.array(trajectory)


def keras_rmsprop(w, gradients, lr, rho, momentum, epsilon, centered):
    """Keras 3 RMSprop; the momentum buffer holds lr-scaled increments."""
    mean_square = np.zeros_like(w)
    mean = np.zeros_like(w)
    buffer = np.zeros_like(w)
    trajectory = []
    for gradient in gradients:
        mean_square = rho * mean_square + (1 - rho) * gradient**2
        mean = rho * mean + (1 - rho) * gradient
        variance = mean_square - mean**2 if centered else mean_square
        increment = f32(lr) * gradient / np.sqrt(variance + epsilon)
        buffer = momentum * buffer + increment
        w = w - buffer
        trajectory.append(w)
    return np.array(trajectory)


def keras_adam(w, gradients, lr, beta_1, beta_2, epsilon, weight_decay=0.0):
    """Kingma & Ba with "epsilon hat"; AdamW first decays w by lr * weight_decay."""
    m = np.zeros_like(w)
    v = np.zeros_like(w)
    trajectory = []
    for t, gradient in enumerate(gradients, start=1):
        w = w - f32(lr) * weight_decay * w
        m = beta_1 * m + (1 - beta_1) * gradient
        v = beta_2 * v + (1 - beta_2) * gradient**2
        step_size = f32(lr) * np.sqrt(1 - beta_2**t) / (1 - beta_1**t)
        w = w - step_size * m / (np.sqrt(v) + epsilon)
        trajectory.append(w)
    return np.array(trajectory)


def run_steps(optimizer, gradients, learning_rates):
    """Applies `gradients` to a float64 variable starting at W0, one per step.

    The learning rate is set with `set_learning_rate` before each step, outside a
    train step that is traced once: a rate baked into the graph would be caught.
    """
    variable = keras.Variable(W0, dtype="float64", name="w")
    optimizer.build([variable])

    @tf.function
    def train_step(gradient):
        optimizer.apply_gradients([(gradient, variable)])

    trajectory = []
    for gradient, lr in zip(gradients, learning_rates):
        optim.set_learning_rate(optimizer, lr)
        train_step(tf.constant(gradient))
        trajectory.append(variable.numpy())
    assert train_step.experimental_get_tracing_count() == 1
    return np.array(trajectory)


@pytest.fixture(scope="module")
def two_replicas():
    return mirrored_strategy(["/cpu:0", "/cpu:1"])


# Momentum: TF1's rule.


@pytest.mark.parametrize("nesterov", [False, True])
def test_momentum_follows_tf1_rule_across_a_learning_rate_drop(nesterov):
    optimizer = optim.create_optimizer(
        {"class": "momentum", "learning_rate": 0.1, "momentum": 0.9, "nesterov": nesterov}
    )
    assert isinstance(optimizer, optim.Momentum)
    trajectory = run_steps(optimizer, GRADIENTS, LEARNING_RATES)
    expected = tf1_momentum(W0, GRADIENTS, LEARNING_RATES, 0.9, nesterov)
    np.testing.assert_allclose(trajectory, expected, rtol=RTOL)


@pytest.mark.parametrize("nesterov", [False, True])
def test_keras_sgd_leaves_tf1_rule_after_the_drop(nesterov):
    # Shows that the momentum test above discriminates: Keras SGD, which the
    # Momentum class replaces, matches TF1 only until the learning rate changes.
    optimizer = optim.create_optimizer(
        {"class": "sgd", "learning_rate": 0.1, "momentum": 0.9, "nesterov": nesterov}
    )
    trajectory = run_steps(optimizer, GRADIENTS, LEARNING_RATES)
    # Keras SGD rounds its momentum to float32 (`ops.cast` of a Python float),
    # so both references use that rounded value here.
    momentum = f32(0.9)
    keras_rule = keras_sgd(W0, GRADIENTS, LEARNING_RATES, momentum, nesterov)
    tf1 = tf1_momentum(W0, GRADIENTS, LEARNING_RATES, momentum, nesterov)

    np.testing.assert_allclose(trajectory, keras_rule, rtol=RTOL)
    np.testing.assert_allclose(trajectory[:DROP_AT], tf1[:DROP_AT], rtol=RTOL)
    assert np.abs(trajectory[DROP_AT:] - tf1[DROP_AT:]).max() > 1e-2


def test_momentum_under_mirrored_strategy_applies_the_summed_gradient(two_replicas):
    strategy = two_replicas
    with strategy.scope():
        variable = keras.Variable(W0, dtype="float64", name="w")
        optimizer = optim.create_optimizer({"class": "momentum", "momentum": 0.9})
        optimizer.build([variable])
    targets = tf.constant(REPLICA_TARGETS)

    @tf.function
    def train_step():
        def replica_step():
            # Each replica pulls w toward its own target: loss = |w - t|^2 / 2.
            replica = tf.distribute.get_replica_context().replica_id_in_sync_group
            with tf.GradientTape() as tape:
                loss = 0.5 * tf.reduce_sum(tf.square(variable - targets[replica]))
            gradients = tape.gradient(loss, [variable])
            optimizer.apply_gradients(zip(gradients, [variable]))

        strategy.run(replica_step)

    trajectory = []
    for lr in LEARNING_RATES:
        optim.set_learning_rate(optimizer, lr)
        train_step()
        copies = strategy.experimental_local_results(variable.value)
        assert len(copies) == 2
        np.testing.assert_array_equal(copies[0].numpy(), copies[1].numpy())
        trajectory.append(copies[0].numpy())

    def summed_gradient(w):
        return (w - REPLICA_TARGETS[0]) + (w - REPLICA_TARGETS[1])

    expected = tf1_momentum(W0, [summed_gradient] * STEPS, LEARNING_RATES, 0.9, False)
    np.testing.assert_allclose(trajectory, expected, rtol=RTOL)
    assert train_step.experimental_get_tracing_count() == 1


def test_momentum_keeps_one_momentum_slot_per_variable():
    optimizer = optim.Momentum()
    optimizer.build([keras.Variable(np.zeros(2), name="w"), keras.Variable(np.zeros(3), name="b")])
    slots = [variable.path for variable in optimizer.variables]
    assert slots == [
        "momentum/iteration",
        "momentum/learning_rate",
        "momentum/w_momentum",
        "momentum/b_momentum",
    ]


def test_momentum_config_round_trips():
    optimizer = optim.Momentum(learning_rate=0.05, momentum=0.8, nesterov=True, clipnorm=2.0)
    clone = optim.Momentum.from_config(optimizer.get_config())
    assert (clone.momentum, clone.nesterov, clone.clipnorm) == (0.8, True, 2.0)
    assert float(clone.learning_rate) == pytest.approx(0.05)


# The Keras classes, built from dicts.

KERAS_RULES = {
    "sgd": (
        {"class": "sgd", "learning_rate": 0.05, "momentum": 0.5, "nesterov": True},
        lambda g: keras_sgd(W0, g, [0.05] * len(g), 0.5, True),
    ),
    "rmsprop": (
        {"class": "rmsprop", "learning_rate": 0.01, "rho": 0.8, "momentum": 0.5, "epsilon": 0.1,
         "centered": True},
        lambda g: keras_rmsprop(W0, g, 0.01, 0.8, 0.5, 0.1, centered=True),
    ),
    "adam": (
        {"class": "adam", "learning_rate": 0.01, "beta_1": 0.8, "beta_2": 0.95, "epsilon": 0.1},
        lambda g: keras_adam(W0, g, 0.01, 0.8, 0.95, 0.1),
    ),
    "adamw": (
        {"class": "adamw", "learning_rate": 0.01, "weight_decay": 0.5, "beta_1": 0.8,
         "beta_2": 0.95, "epsilon": 0.1},
        lambda g: keras_adam(W0, g, 0.01, 0.8, 0.95, 0.1, weight_decay=0.5),
    ),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(KERAS_RULES))
def test_keras_classes_follow_their_rules(name):
    # A large epsilon and non-default betas make a dropped argument visible.
    config, reference = KERAS_RULES[name]
    gradients = GRADIENTS[:2]
    trajectory = run_steps(optim.create_optimizer(config), gradients, [config["learning_rate"]] * 2)
    np.testing.assert_allclose(trajectory, reference(gradients), rtol=RTOL)


@pytest.mark.parametrize("distributed", [False, True], ids=["default", "mirrored"])
def test_adamw_decays_kernels_only(distributed, two_replicas):
    # Keras matches the TensorFlow variable name, a whole path such as
    # "beta_logits/kernel:0" (or ".../replica_1:0"): the kernel of a layer whose
    # name contains "beta" must still decay.
    strategy = two_replicas if distributed else tf.distribute.get_strategy()
    config = {"class": "adamw", "learning_rate": 0.01, "weight_decay": 0.5, "epsilon": 0.1}
    with strategy.scope():
        norm = keras.layers.BatchNormalization(name="stage1_unit0_bn1", dtype="float64")
        dense = keras.layers.Dense(3, name="beta_logits", dtype="float64")
        norm.build((None, 3))
        dense.build((None, 3))
        variables = norm.trainable_variables + dense.trainable_variables
        for variable in variables:
            variable.assign(_rng.normal(size=variable.shape))
        optimizer = optim.create_optimizer(config)
        optimizer.build(variables)
    names = [variable.name for variable in variables]
    assert names == ["gamma", "beta", "kernel", "bias"]
    initial = [variable.numpy() for variable in variables]
    gradients = [_rng.normal(size=(2, *variable.shape)) for variable in variables]

    @tf.function
    def train_step(step_gradients):
        def replica_step():
            # A linear loss whose gradient is `step_gradients`, computed in the
            # replica as a trainer does. (MirroredStrategy fails to all-reduce a
            # tensor made outside the replica function: "destinations can not be
            # empty".)
            with tf.GradientTape() as tape:
                loss = tf.add_n([tf.reduce_sum(g * v) for g, v in zip(step_gradients, variables)])
            optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))

        strategy.run(replica_step)

    for step in range(2):
        train_step([tf.constant(g[step]) for g in gradients])

    # Every replica contributes the same gradient, and their sum is applied.
    replicas = strategy.num_replicas_in_sync
    for name, variable, w0, g in zip(names, variables, initial, gradients):
        decay = 0.5 if name == "kernel" else 0.0
        expected = keras_adam(w0, replicas * g, 0.01, 0.9, 0.999, 0.1, weight_decay=decay)
        np.testing.assert_allclose(variable.numpy(), expected[-1], rtol=RTOL, err_msg=name)


@pytest.mark.parametrize("distributed", [False, True], ids=["default", "mirrored"])
def test_global_clipnorm_clips_each_replica_before_the_sum(distributed, two_replicas):
    strategy = two_replicas if distributed else tf.distribute.get_strategy()
    with strategy.scope():
        variable = keras.Variable(np.zeros(2), dtype="float64", name="w")
        optimizer = optim.create_optimizer(
            {"class": "sgd", "learning_rate": 1.0, "global_clipnorm": 1.0}
        )
        optimizer.build([variable])

    @tf.function
    def train_step():
        gradient = tf.constant([3.0, 4.0], tf.float64)  # Norm 5, clipped to 1.
        strategy.run(lambda: optimizer.apply_gradients([(gradient, variable)]))

    train_step()
    replicas = strategy.num_replicas_in_sync
    np.testing.assert_allclose(variable.numpy(), -replicas * np.array([0.6, 0.8]), rtol=RTOL)


# lars's velocity holds rate-scaled steps (as Keras SGD's): with momentum it
# coasts on after the rate drops to 0, so the check below takes it without.
WITHOUT_MOMENTUM = {"lars": {"momentum": 0.0}}


@pytest.mark.parametrize("name", sorted(optim.OPTIMIZERS))
def test_set_learning_rate_reaches_a_compiled_step(name):
    optimizer = optim.create_optimizer({"class": name, **WITHOUT_MOMENTUM.get(name, {})})
    variable = keras.Variable(W0, dtype="float64", name="w")
    optimizer.build([variable])

    @tf.function
    def train_step():
        optimizer.apply_gradients([(tf.constant(GRADIENTS[0]), variable)])

    train_step()
    moved = variable.numpy()
    assert np.abs(moved - W0).min() > 1e-5
    optim.set_learning_rate(optimizer, 0.0)
    train_step()
    # With the default (zero) momentum of sgd and rmsprop, and with TF1 momentum,
    # a zero learning rate stops every class at once.
    np.testing.assert_array_equal(variable.numpy(), moved)
    assert float(optimizer.learning_rate) == 0.0
    assert train_step.experimental_get_tracing_count() == 1


def test_set_learning_rate_rejects_a_schedule():
    schedule = keras.optimizers.schedules.ExponentialDecay(0.1, decay_steps=10, decay_rate=0.5)
    with pytest.raises(TypeError, match="float learning_rate"):
        optim.set_learning_rate(keras.optimizers.SGD(learning_rate=schedule), 0.01)


# Config checks.


def test_defaults_are_filled_in():
    assert optim.check_optimizer_config({"class": "momentum"}) == {
        "class": "momentum",
        "learning_rate": 0.1,
        "momentum": 0.9,
        "nesterov": False,
        "clipnorm": None,
        "global_clipnorm": None,
    }
    learning_rates = {
        name: optim.check_optimizer_config({"class": name})["learning_rate"]
        for name in optim.OPTIMIZERS
    }
    assert learning_rates == {
        "momentum": 0.1,
        "sgd": 0.1,
        "rmsprop": 0.001,
        "adam": 0.001,
        "adamw": 0.001,
        "lamb": 0.001,
        "lars": 0.1,
    }


@pytest.mark.parametrize(
    "name, keras_class",
    [
        ("momentum", optim.Momentum),
        ("sgd", keras.optimizers.SGD),
        ("rmsprop", keras.optimizers.RMSprop),
        ("adam", keras.optimizers.Adam),
        ("adamw", keras.optimizers.AdamW),
        ("lamb", large_batch.Lamb),
        ("lars", large_batch.Lars),
    ],
)
def test_create_optimizer_picks_the_class(name, keras_class):
    assert type(optim.create_optimizer({"class": name})) is keras_class


def test_integers_are_accepted_as_numbers():
    # YAML `learning_rate: 1` is an int, which Keras itself refuses.
    config = {"class": "sgd", "learning_rate": 1, "momentum": 0}
    checked = optim.check_optimizer_config(config)
    assert checked["learning_rate"] == 1.0 and isinstance(checked["learning_rate"], float)
    assert config == {"class": "sgd", "learning_rate": 1, "momentum": 0}  # Not modified.
    assert float(optim.create_optimizer(config).learning_rate) == 1.0


def one_line_error(config) -> str:
    with pytest.raises(ConfigError) as error:
        optim.check_optimizer_config(config)
    message = str(error.value)
    assert "\n" not in message
    return message


def test_unknown_class_lists_the_valid_ones():
    message = one_line_error({"class": "nadam", "learning_rate": 0.1})
    assert "'nadam'" in message
    assert "adam, adamw, lamb, lars, momentum, rmsprop, sgd" in message


def test_unknown_argument_is_named_with_the_valid_ones():
    message = one_line_error({"class": "momentum", "beta_1": 0.9})
    assert "beta_1" in message and "'momentum'" in message
    assert "learning_rate, momentum, nesterov, clipnorm, global_clipnorm" in message


@pytest.mark.parametrize(
    "config, key",
    [
        ({"class": "momentum", "learning_rate": "0.1"}, "learning_rate"),
        ({"class": "adam", "learning_rate": True}, "learning_rate"),
        ({"class": "adam", "learning_rate": -0.001}, "learning_rate"),
        ({"class": "sgd", "learning_rate": float("nan")}, "learning_rate"),
        ({"class": "momentum", "momentum": 1.0}, "momentum"),
        ({"class": "sgd", "momentum": -0.1}, "momentum"),
        ({"class": "rmsprop", "momentum": 1}, "momentum"),
        ({"class": "momentum", "nesterov": "yes"}, "nesterov"),
        ({"class": "adam", "epsilon": 0.0}, "epsilon"),
        ({"class": "adam", "epsilon": "1e-7"}, "epsilon"),
        ({"class": "adam", "beta_2": 1.0}, "beta_2"),
        ({"class": "rmsprop", "rho": -0.5}, "rho"),
        ({"class": "rmsprop", "centered": 1}, "centered"),
        ({"class": "adamw", "weight_decay": -1e-4}, "weight_decay"),
        ({"class": "adamw", "amsgrad": None}, "amsgrad"),
        ({"class": "sgd", "clipnorm": 0.0}, "clipnorm"),
        ({"class": "sgd", "global_clipnorm": "1"}, "global_clipnorm"),
        ({"class": "sgd", "clipnorm": 1.0, "global_clipnorm": 1.0}, "global_clipnorm"),
        ({"learning_rate": 0.1}, "class"),
        ({"class": None}, "None"),
    ],
)
def test_bad_values_name_the_key(config, key):
    assert key in one_line_error(config)


def test_yaml_style_exponent_gets_a_hint():
    assert "1.0e-7" in one_line_error({"class": "adam", "epsilon": "1e-7"})


def test_config_must_be_a_mapping():
    one_line_error(["momentum"])


@pytest.mark.parametrize(
    "name, excluded",
    [
        ("stage1_unit0_bn1/gamma:0", True),
        ("stage1_unit0_bn1/beta:0", True),
        ("stage1_unit0_bn1/beta/replica_1:0", True),
        ("logits/bias:0", True),
        ("bias", True),
        ("beta_logits/kernel:0", False),
        ("bias_conv/kernel/replica_1:0", False),
        ("stage1_unit0_conv1/kernel:0", False),
    ],
)
def test_weight_decay_exclusion_matches_the_last_path_component(name, excluded):
    # Keras joins the strings into one regular expression and searches the
    # TensorFlow variable name; the adamw test above checks that end to end.
    pattern = re.compile("|".join(optim.NO_WEIGHT_DECAY))
    assert (pattern.search(name) is not None) == excluded


def test_every_registered_kind_builds_a_keras_optimizer():
    from resnet_app.config.optimizer_kinds import OptimizerSection

    for name in OptimizerSection.KINDS:
        optimizer = optim.create_optimizer({"class": name})
        assert isinstance(optimizer, keras.optimizers.Optimizer), name
        expected = optim.OPTIMIZERS[name]["learning_rate"]
        assert optimizer.learning_rate.numpy() == np.float32(expected), name


# --- A new kind: its Keras class and its dataclass, nothing else ------------------------


class ToySignDescent(keras.optimizers.Optimizer):
    """signSGD (Bernstein et al. 2018) with decoupled decay: w -= lr * (sign(g) + decay * w)."""

    def __init__(self, learning_rate=0.01, decay=0.0, name="toy_sign", **kwargs):
        super().__init__(learning_rate=learning_rate, name=name, **kwargs)
        self.decay = decay

    def update_step(self, gradient, variable, learning_rate):
        learning_rate = keras.ops.cast(learning_rate, variable.dtype)
        step = keras.ops.sign(gradient) + self.decay * variable
        variable.assign_sub(learning_rate * step)


def test_a_new_kind_takes_its_class_and_dataclass_only(monkeypatch):
    """An optimizer declared here (arguments, ranges and the class it builds in one
    dataclass, registered by its `kind=`) is checked, built, trained with and
    documented from a config, with no other edit."""
    import dataclasses

    from resnet_app.common import fields
    from resnet_app.config import optimizer_kinds, reference

    # A copy of the registry, restored after the test: no other test sees the toy kind.
    family = optimizer_kinds.OptimizerSection
    monkeypatch.setattr(family, "KINDS", dict(family.KINDS))

    @dataclasses.dataclass(frozen=True, eq=False)
    class ToySign(family, kind="toy_sign"):
        """signSGD with decoupled decay.

        Attributes:
          learning_rate: the base learning rate (the schedule scales it).
          decay: decoupled weight decay per unit of learning rate, >= 0.
          clipnorm: clip each variable's gradient to this norm (or null).
          global_clipnorm: or clip all gradients together to this norm (or null).
        """

        OPTIMIZER = f"{__name__}:ToySignDescent"

        learning_rate: float = fields.setting(0.01, fields.AT_LEAST_0)
        decay: float = fields.setting(0.0, fields.AT_LEAST_0)
        clipnorm: float | None = optimizer_kinds.clipping("global_clipnorm")
        global_clipnorm: float | None = optimizer_kinds.clipping("clipnorm")

    assert "decay" in one_line_error({"class": "toy_sign", "decay": -1})
    assert "toy_sign" in one_line_error({"class": "nope"})
    assert optim.check_optimizer_config({"class": "toy_sign", "decay": 1}) == {
        "class": "toy_sign",
        "learning_rate": 0.01,
        "decay": 1.0,
        "clipnorm": None,
        "global_clipnorm": None,
    }

    optimizer = optim.create_optimizer({"class": "toy_sign", "learning_rate": 0.5, "decay": 0.1})
    assert type(optimizer) is ToySignDescent
    variable = keras.Variable(W0.astype(np.float32))
    optimizer.build([variable])
    expected = W0.astype(np.float32)
    for gradient in GRADIENTS[:3]:
        optimizer.apply_gradients([(tf.constant(gradient, tf.float32), variable)])
        expected = expected - np.float32(0.5) * (np.sign(gradient) + np.float32(0.1) * expected)
        np.testing.assert_allclose(variable.numpy(), expected, rtol=RTOL)

    documented = reference.markdown()  # docs/config.md's text, from the registry.
    assert "toy_sign" in documented and "decoupled weight decay per unit" in documented
