"""LAMB and LARS (`optimizer.class: lamb | lars`) against NumPy references written from the papers.

The references are float64 NumPy of Algorithm 2 of You et al. 2020 (LAMB) and
Algorithm 1 of You, Gitman, Ginsburg 2017 (LARS, with the epsilon of TF 1.x's
`LARSOptimizer`), not of optim.py. Which variables are excluded from the decay
and the trust ratio is written out here by path (`EXCLUDED`), not read from
optim.py. The variables are those of a tiny float64 Keras model named like the
app's (`stage1_unit0_conv1/kernel`, `stage1_unit0_bn1/gamma`, ...); the only
float32 number is the learning rate, which Keras keeps in a float32 variable,
so the references round it the same way (`f32`).
"""

import contextlib
import functools

import keras
import numpy as np
import pytest
import tensorflow as tf

from resnet_app.common.distribute import mirrored_strategy
from resnet_app.common.errors import ConfigError
from resnet_app.engine import large_batch, local_sgd, optim

RTOL = 1e-5
STEPS = 6
LEARNING_RATES = [0.05] * 3 + [0.02] * 3  # A drop, set per step as the trainer does.
# Short names, in the model's order; the model's variables are "tiny/<name>".
NAMES = [
    "stage1_unit0_conv1/kernel",
    "stage1_unit0_conv1/bias",
    "stage1_unit0_bn1/gamma",
    "stage1_unit0_bn1/beta",
    "beta_logits/kernel",  # "beta" in the layer name: still decayed and adapted.
]
EXCLUDED = {"stage1_unit0_conv1/bias", "stage1_unit0_bn1/gamma", "stage1_unit0_bn1/beta"}

LAMB = {"class": "lamb", "beta_1": 0.8, "beta_2": 0.95, "epsilon": 1e-3}
LARS = {"class": "lars", "momentum": 0.8, "eeta": 0.05, "epsilon": 0.01}


def f32(value: float) -> float:
    """`value` as the optimizer's float32 learning-rate variable holds it."""
    return float(np.float32(value))


def norm(x: np.ndarray) -> float:
    return float(np.sqrt(np.sum(x**2)))


# NumPy references: the variable after each step, shape (steps, ...).


def lamb_reference(w, gradients, rates, beta_1, beta_2, epsilon, weight_decay, adapt):
    """LAMB: Adam's bias-corrected step r; u = r + wd * w; w -= lr * ||w|| / ||u|| * u."""
    m = np.zeros_like(w)
    v = np.zeros_like(w)
    trajectory = []
    for t, (g, lr) in enumerate(zip(gradients, rates), start=1):
        m = beta_1 * m + (1 - beta_1) * g
        v = beta_2 * v + (1 - beta_2) * g**2
        update = (m / (1 - beta_1**t)) / (np.sqrt(v / (1 - beta_2**t)) + epsilon)
        ratio = 1.0
        if adapt:
            update = update + weight_decay * w
            if norm(w) > 0 and norm(update) > 0:
                ratio = norm(w) / norm(update)
        w = w - lr * ratio * update
        trajectory.append(w)
    return np.array(trajectory)


def lars_reference(w, gradients, rates, momentum, eeta, epsilon, weight_decay, nesterov, adapt):
    """LARS: ratio = eeta ||w|| / (||g|| + wd ||w|| + eps); v = m v + lr ratio (g + wd w)."""
    v = np.zeros_like(w)
    trajectory = []
    for g, lr in zip(gradients, rates):
        ratio = 1.0
        if adapt:
            if norm(w) > 0 and norm(g) > 0:
                ratio = eeta * norm(w) / (norm(g) + weight_decay * norm(w) + epsilon)
            g = g + weight_decay * w
        v = momentum * v + lr * ratio * g
        w = w - (momentum * v + lr * ratio * g if nesterov else v)
        trajectory.append(w)
    return np.array(trajectory)


def reference(config, w0, gradients, rates, adapt):
    """The reference of `config` (a lamb or lars dict) for one variable."""
    args = {**optim.check_optimizer_config(config)}
    kind = args.pop("class")
    wd = args["weight_decay"]
    if kind == "lamb":
        return lamb_reference(
            w0, gradients, rates, args["beta_1"], args["beta_2"], args["epsilon"], wd, adapt
        )
    return lars_reference(
        w0, gradients, rates, args["momentum"], args["eeta"], args["epsilon"], wd,
        args["nesterov"], adapt,
    )  # fmt: skip


# The model, its initial weights and gradients.


def tiny_model() -> keras.Model:
    """Conv (kernel, bias), BatchNorm (gamma, beta), a bias-free Dense: float64, app-like names."""
    return keras.Sequential(
        [
            keras.Input((4, 4, 2), dtype="float64"),
            keras.layers.Conv2D(4, 3, name="stage1_unit0_conv1", dtype="float64"),
            keras.layers.BatchNormalization(name="stage1_unit0_bn1", dtype="float64"),
            keras.layers.Flatten(),
            keras.layers.Dense(3, use_bias=False, name="beta_logits", dtype="float64"),
        ],
        name="tiny",
    )


_rng = np.random.default_rng(0)
SHAPES = [(3, 3, 2, 4), (4,), (4,), (4,), (16, 3)]
INITIAL = [_rng.normal(size=shape) for shape in SHAPES]
INITIAL[1] = np.zeros(4)  # A zero bias: ||w|| = 0 takes ratio 1 when it is adapted.
# GRADIENTS[replica][step][variable].
GRADIENTS = [[[_rng.normal(size=s) for s in SHAPES] for _ in range(STEPS)] for _ in range(2)]
for replica_gradients in GRADIENTS:
    replica_gradients[2][4] = np.zeros(SHAPES[4])  # ||g|| = 0 at step 2: ratio 1.


def build(config, strategy=None, lr_multipliers=None, local=False):
    """(model, optimizer) in `strategy.scope()`, at INITIAL, the optimizer built."""
    strategy = strategy or tf.distribute.get_strategy()
    with strategy.scope(), local_sgd.local_variables() if local else contextlib.nullcontext():
        model = tiny_model()
        variables = model.trainable_variables
        assert [v.path for v in variables] == [f"tiny/{name}" for name in NAMES]
        for variable, value in zip(variables, INITIAL):
            variable.assign(value)
        optimizer = optim.create_optimizer(config, lr_multipliers)
        optimizer.build(variables)
    return model, optimizer


def train(model, optimizer, strategy=None, steps=range(STEPS), apply=None):
    """Runs `steps`; replica r's gradient is GRADIENTS[r] (a linear loss), in one traced step."""
    strategy = strategy or tf.distribute.get_strategy()
    variables = model.trainable_variables
    stacked = [
        [tf.constant(np.stack([GRADIENTS[r][s][i] for r in range(2)])) for i in range(len(SHAPES))]
        for s in range(STEPS)
    ]

    def replica_step(step_gradients):
        replica = tf.distribute.get_replica_context().replica_id_in_sync_group
        with tf.GradientTape() as tape:
            loss = tf.add_n(
                [tf.reduce_sum(g[replica] * v) for g, v in zip(step_gradients, variables)]
            )
        gradients = tape.gradient(loss, variables)
        if apply:
            apply(gradients, variables)
        else:
            optimizer.apply_gradients(zip(gradients, variables))

    @tf.function
    def train_step(step_gradients):
        strategy.run(replica_step, args=(step_gradients,))

    history = []
    for step in steps:
        optim.set_learning_rate(optimizer, LEARNING_RATES[step])
        train_step(stacked[step])
        history.append(
            [[c.numpy() for c in strategy.experimental_local_results(v.value)] for v in variables]
        )
    assert train_step.experimental_get_tracing_count() == 1
    return history  # history[step][variable][replica copy]


def expected(config, replicas=(0,), factors=None, adapt=None):
    """Per variable, the reference trajectory for the sum of the replicas' gradients."""
    results = []
    for i, name in enumerate(NAMES):
        factor = (factors or {}).get(name, 1.0)
        rates = [f32(f32(lr) * factor) for lr in LEARNING_RATES]
        gradients = [sum(GRADIENTS[r][s][i] for r in replicas) for s in range(STEPS)]
        excluded = name in EXCLUDED if adapt is None else not adapt
        results.append(reference(config, INITIAL[i], gradients, rates, adapt=not excluded))
    return results


def check(history, references, copy=0):
    for i, name in enumerate(NAMES):
        got = np.array([step[i][copy] for step in history])
        want = references[i]
        np.testing.assert_allclose(got, want, rtol=RTOL, err_msg=name)
        # The steps themselves, not only the weights they are added to.
        np.testing.assert_allclose(got - INITIAL[i], want - INITIAL[i], rtol=RTOL, atol=1e-12)


# One device: the rules, with and without decay, with and without exclusions.

CASES = [
    pytest.param({**LAMB, "weight_decay": 0.0}, id="lamb"),
    pytest.param({**LAMB, "weight_decay": 0.1}, id="lamb-decay"),
    pytest.param({**LARS, "weight_decay": 0.0}, id="lars"),
    pytest.param({**LARS, "weight_decay": 0.1}, id="lars-decay"),
    pytest.param({**LARS, "weight_decay": 0.1, "nesterov": True}, id="lars-decay-nesterov"),
]


@pytest.mark.parametrize("config", CASES)
def test_follows_the_paper_with_bn_and_bias_excluded(config):
    model, optimizer = build(config)
    check(train(model, optimizer), expected(config))


@pytest.mark.parametrize("config", CASES)
def test_without_exclusions_every_variable_adapts(config):
    config = {**config, "exclude_from_adaptation": False}
    model, optimizer = build(config)
    check(train(model, optimizer), expected(config, adapt=True))


@pytest.mark.parametrize("kind", ["lamb", "lars"])
def test_excluded_variables_follow_keras_adam_or_momentum(kind):
    # Written another way than the references: Keras's own Adam and SGD. (Keras
    # Adam adds epsilon before the bias correction of v: a tiny epsilon hides it.)
    if kind == "lamb":
        config = {**LAMB, "weight_decay": 0.1, "epsilon": 1e-12}
        keras_optimizer = keras.optimizers.Adam(beta_1=0.8, beta_2=0.95, epsilon=1e-12)
    else:
        config = {**LARS, "weight_decay": 0.1}
        keras_optimizer = keras.optimizers.SGD(momentum=0.8)
    model, optimizer = build(config)
    history = train(model, optimizer)
    gamma = keras.Variable(INITIAL[2], dtype="float64")
    keras_optimizer.build([gamma])
    for step in range(STEPS):
        keras_optimizer.learning_rate.assign(LEARNING_RATES[step])
        keras_optimizer.apply_gradients([(tf.constant(GRADIENTS[0][step][2]), gamma)])
        np.testing.assert_allclose(history[step][2][0], gamma.numpy(), rtol=RTOL)
    # The adapted rule differs visibly from the plain one, so the exclusion shows.
    plain, adapted = expected(config, adapt=False), expected(config, adapt=True)
    for i in range(len(NAMES)):
        assert np.abs(plain[i] - adapted[i]).max() > 1e-3, NAMES[i]


# Distribution, model averaging, per-part rates, checkpoints.


@pytest.fixture(scope="module")
def two_replicas():
    return mirrored_strategy(["/cpu:0", "/cpu:1"])


@pytest.mark.parametrize("config", [CASES[1], CASES[3]])
def test_two_replicas_apply_the_summed_gradient(config, two_replicas):
    model, optimizer = build(config, two_replicas)
    history = train(model, optimizer, two_replicas)
    for step in history:
        for copies in step:
            assert len(copies) == 2
            np.testing.assert_array_equal(copies[0], copies[1])
    check(history, expected(config, replicas=(0, 1)))


@pytest.mark.parametrize("config", [CASES[1], CASES[3]])
def test_model_averaging_updates_each_copy_with_its_own_gradient(config, two_replicas):
    # `local_sgd.LocalSGD.apply` calls `update_step` directly; with
    # no average in between, copy r follows the rule on replica r's gradient.
    model, optimizer = build(config, two_replicas, local=True)
    averager = local_sgd.LocalSGD(model, optimizer, two_replicas, interval=10**9)
    history = train(
        model, optimizer, two_replicas, apply=functools.partial(averager.apply, optimizer)
    )
    for replica in (0, 1):
        check(history, expected(config, replicas=(replica,)), copy=replica)


@pytest.mark.parametrize("config", [CASES[1], CASES[3]])
def test_lr_multipliers_scale_the_rule_per_variable(config):
    factors = {"stage1_unit0_conv1/kernel": 0.1, "stage1_unit0_bn1/gamma": 3.0}
    paths = {f"tiny/{name}": factor for name, factor in factors.items()}
    model, optimizer = build(config, lr_multipliers=paths)
    assert type(optimizer).__name__.endswith("WithLrMultipliers")
    check(train(model, optimizer), expected(config, factors=factors))


@pytest.mark.parametrize("config", [CASES[1], CASES[4]])
def test_a_restored_checkpoint_continues_the_same_steps(config, tmp_path):
    model, optimizer = build(config)
    train(model, optimizer, steps=range(3))
    path = tf.train.Checkpoint(model=model, optimizer=optimizer).write(str(tmp_path / "ckpt"))
    model, optimizer = build(config)
    tf.train.Checkpoint(model=model, optimizer=optimizer).read(path).assert_consumed()
    history = train(model, optimizer, steps=range(3, STEPS))
    references = expected(config)
    for i, name in enumerate(NAMES):
        got = np.array([step[i][0] for step in history])
        np.testing.assert_allclose(got, references[i][3:], rtol=RTOL, err_msg=name)


# The optimizer objects and the config.


@pytest.mark.parametrize(
    "kind, cls, slots",
    [
        ("lamb", large_batch.Lamb, ["momentum", "velocity"]),
        ("lars", large_batch.Lars, ["momentum"]),
    ],
)
def test_slots_and_config_round_trip(kind, cls, slots):
    model, optimizer = build({"class": kind, "weight_decay": 0.02})
    assert type(optimizer) is cls
    paths = [v.path for v in optimizer.variables]
    assert len(paths) == len(set(paths)) == 2 + len(slots) * len(NAMES)
    assert f"{kind}/tiny_stage1_unit0_bn1_gamma_{slots[-1]}" in paths
    assert optimizer.weight_decay is None  # Keras's own decoupled decay stays off.
    clone = cls.from_config(optimizer.get_config())
    assert clone.get_config() == optimizer.get_config()
    assert clone.weight_decay_rate == 0.02 and clone.exclude_from_adaptation


def test_defaults():
    assert optim.check_optimizer_config({"class": "lamb"}) == {
        "class": "lamb", "learning_rate": 0.001, "beta_1": 0.9, "beta_2": 0.999,
        "epsilon": 1e-6, "weight_decay": 0.0, "exclude_from_adaptation": True,
        "clipnorm": None, "global_clipnorm": None,
    }  # fmt: skip
    assert optim.check_optimizer_config({"class": "lars"}) == {
        "class": "lars", "learning_rate": 0.1, "momentum": 0.9, "eeta": 0.001,
        "weight_decay": 0.0, "epsilon": 0.0, "nesterov": False,
        "exclude_from_adaptation": True, "clipnorm": None, "global_clipnorm": None,
    }  # fmt: skip


@pytest.mark.parametrize(
    "config, key",
    [
        ({"class": "lars", "eeta": -0.001}, "eeta"),
        ({"class": "lars", "eeta": 0.0}, "eeta"),
        ({"class": "lars", "momentum": 1.0}, "momentum"),
        ({"class": "lars", "weight_decay": -1e-4}, "weight_decay"),
        ({"class": "lars", "epsilon": -1.0}, "epsilon"),
        ({"class": "lars", "nesterov": "yes"}, "nesterov"),
        ({"class": "lars", "exclude_from_adaptation": 1}, "exclude_from_adaptation"),
        ({"class": "lars", "learning_rate": -0.1}, "learning_rate"),
        ({"class": "lamb", "beta_1": 1.0}, "beta_1"),
        ({"class": "lamb", "beta_2": -0.1}, "beta_2"),
        ({"class": "lamb", "epsilon": 0.0}, "epsilon"),
        ({"class": "lamb", "weight_decay": -0.02}, "weight_decay"),
        ({"class": "lamb", "weight_decay": "2e-2"}, "weight_decay"),
        ({"class": "lamb", "exclude_from_adaptation": "true"}, "exclude_from_adaptation"),
        ({"class": "lamb", "momentum": 0.9}, "momentum"),
        ({"class": "lamb", "clipnorm": 1.0, "global_clipnorm": 1.0}, "global_clipnorm"),
    ],
)
def test_bad_arguments_are_one_line_errors_naming_the_key(config, key):
    with pytest.raises(ConfigError) as error:
        optim.check_optimizer_config(config)
    message = str(error.value)
    assert "\n" not in message
    assert key in message and f"'{config['class']}'" in message
