"""Importing pretrained weights: checked against implementations no one here wrote.

Keras applications' ResNet (built by Keras itself, its weights randomized and
saved as Keras applications saves its files) and a NumPy forward of
torchvision's ResNet (`torchvision_reference.py`, written from torchvision's
definition) give the logits our network must reproduce from the imported file.
"""

import h5py
import keras
import numpy as np
import pytest
from keras.src.legacy.saving import legacy_h5_format
from safetensors.numpy import save_file

from resnet_app.common.errors import ConfigError
from resnet_app.data import sources as data_sources
from resnet_app.engine import optim
from resnet_app.nets import parts
from resnet_app.nets.resnet import create_model
from resnet_app.pretrained import keras_files, read_weights, sources
from resnet_app.pretrained.weights import assign
from tests import timm_reference, torchvision_reference
from tests.tfds_mock import closed_port
from tests.torchvision_reference import forward, random_state_dict

SIZE = 64
KERAS_MODELS = {"resnet50": keras.applications.ResNet50, "resnet101": keras.applications.ResNet101}


def random_keras_model(name, num_classes, seed=0):
    """Keras applications' `name` with every weight and BatchNorm statistic random."""
    rng = np.random.default_rng(seed)
    model = KERAS_MODELS[name](
        weights=None, classes=num_classes, classifier_activation=None, input_shape=(SIZE, SIZE, 3)
    )
    for layer in model.layers:
        values = []
        for variable in layer.weights:
            shape, kind = tuple(variable.shape), variable.path.rsplit("/", 1)[-1]
            if kind == "kernel":
                value = rng.normal(0, np.sqrt(1.0 / np.prod(shape[:-1])), shape)
            elif kind == "gamma":
                value = rng.uniform(0.5, 1.0, shape)
            elif kind == "moving_variance":
                value = rng.uniform(0.5, 2.0, shape)
            else:  # Biases, beta, moving_mean: conv biases exercise the folding.
                value = rng.normal(0, 0.2, shape)
            values.append(value.astype("float32"))
        if values:
            layer.set_weights(values)
    return model


def save_like_keras_applications(model, path):
    """The HDF5 layout of Keras applications' published weight files."""
    with h5py.File(path, "w") as file:
        legacy_h5_format.save_weights_to_hdf5_group(file, model)


def imported(source, name, num_classes, init_head="auto"):
    model = create_model(name, num_classes=num_classes, **source.model_fields)
    model.build((None, SIZE, SIZE, 3))
    report = assign(model, read_weights(source, model, name), source.spec, name, init_head)
    return model, report


def normalized(rgb, source):
    return (rgb - np.array(source.mean, "float32")) / np.array(source.std, "float32")


def relative(ours, theirs):
    return float(np.abs(ours - theirs).max() / np.abs(theirs).max())


@pytest.mark.parametrize("name", ["resnet50", pytest.param("resnet101", marks=pytest.mark.slow)])
def test_keras_applications_file_reproduces_keras_logits(name, tmp_path):
    theirs = random_keras_model(name, num_classes=7)
    save_like_keras_applications(theirs, tmp_path / "weights.h5")
    source = sources.parse(str(tmp_path / "weights.h5"))
    ours, report = imported(source, name, 7)
    assert report.new == {}
    rgb = np.random.default_rng(1).uniform(0, 255, (4, SIZE, SIZE, 3)).astype("float32")
    # What Keras applications' preprocess_input does: RGB to BGR, minus the BGR mean.
    keras_input = keras.applications.resnet.preprocess_input(rgb.copy())
    inference = relative(
        ours(normalized(rgb, source), training=False).numpy(), theirs(keras_input).numpy()
    )
    assert inference <= 1e-4
    # Batch statistics: each conv's bias cancels in the batch mean (measured 5e-5
    # for resnet50: float32 rounding through 50 normalized layers).
    training = relative(
        ours(normalized(rgb, source), training=True).numpy(),
        theirs(keras_input, training=True).numpy(),
    )
    assert training <= 1e-3


# One of each family's layouts: torchvision's grouped convs; timm's deep stem and
# average-pool shortcut (basic and bottleneck), SE, ECA, and ResNet-RS's stem conv.
FAMILY = ["resnext50_32x4d", "resnet18d", "seresnext50_32x4d", "ecaresnet50d", "resnetrs50"]
FAMILY_SLOW = ["wide_resnet50_2", "resnet50s", "resnet50c", "seresnet50", "resnext101_32x8d"]


@pytest.mark.parametrize(
    "name", FAMILY + [pytest.param(name, marks=pytest.mark.slow) for name in FAMILY_SLOW]
)
def test_a_torchvision_or_timm_family_file_reproduces_its_numpy_forward(name, tmp_path):
    """Features and logits of the imported file against timm_reference (written from timm)."""
    state = timm_reference.random_state_dict(name, 6, np.random.default_rng(8))
    save_file(state, str(tmp_path / "model.safetensors"))
    source = sources.parse(str(tmp_path / "model.safetensors"))
    ours, report = imported(source, name, 6)
    assert report.new == {}
    assert len(report.skipped) == sum(key.endswith("num_batches_tracked") for key in state)
    # An odd size: the strided convs' symmetric padding and the average pools'
    # partial windows both show.
    size = 72
    rgb = np.random.default_rng(9).uniform(0, 255, (2, size, size, 3)).astype("float32")
    scaled = (rgb / 255 - np.array([0.485, 0.456, 0.406])) / np.array([0.229, 0.224, 0.225])
    logits, features = timm_reference.forward(
        state, name, scaled.transpose(0, 3, 1, 2), return_features=True
    )
    images = normalized(rgb, source)
    assert relative(ours(images, training=False).numpy(), logits) <= 1e-4
    assert relative(ours.features(images, training=False).numpy(), features) <= 1e-4


@pytest.mark.parametrize(
    "file_of,model,message",
    [
        (
            "resnet50",
            "resnet50d",
            r"resnet50d has conv1\.0\.weight \(our stem_conv1/kernel\), which",
        ),
        ("resnet50d", "resnet50c", r"resnet50c has layer1\.0\.downsample\.0\.weight"),
        (
            "seresnet50",
            "resnet50",
            r"has tensor layer1\.0\.se\.fc1\.\w+ \[16\S*\], which resnet50 does not",
        ),
        ("resnext50_32x4d", "resnet50", r"stage1_unit0_conv1/kernel is \(1, 1, 64, 128\) in"),
    ],
)
def test_a_file_of_another_variant_names_the_first_difference(file_of, model, message, tmp_path):
    reference = timm_reference if file_of in timm_reference.ARCHS else torchvision_reference
    state = reference.random_state_dict(file_of, 10, np.random.default_rng(0))
    save_file(state, str(tmp_path / "other.safetensors"))
    source = sources.parse(str(tmp_path / "other.safetensors"))
    with pytest.raises(ConfigError, match=message) as raised:
        imported(source, model, 10)
    assert "\n" not in str(raised.value)


@pytest.mark.parametrize("name", ["resnet18", "resnet50"])
def test_torchvision_file_reproduces_a_numpy_torchvision_forward(name, tmp_path):
    state = random_state_dict(name, 5, np.random.default_rng(2))
    save_file(state, str(tmp_path / "model.safetensors"))
    source = sources.parse(str(tmp_path / "model.safetensors"))
    ours, report = imported(source, name, 5)
    assert len(report.skipped) == sum(key.endswith("num_batches_tracked") for key in state)
    rgb = np.random.default_rng(3).uniform(0, 255, (3, SIZE, SIZE, 3)).astype("float32")
    # torchvision's transform: RGB / 255, minus its mean, over its std; NCHW.
    scaled = (rgb / 255 - np.array([0.485, 0.456, 0.406])) / np.array([0.229, 0.224, 0.225])
    expected = forward(state, name, scaled.transpose(0, 3, 1, 2))
    assert relative(ours(normalized(rgb, source), training=False).numpy(), expected) <= 1e-4


def test_same_padding_would_not_reproduce_torchvision(tmp_path):
    """The control: the padding field is what makes the import exact."""
    state = random_state_dict("resnet18", 5, np.random.default_rng(2))
    save_file(state, str(tmp_path / "model.safetensors"))
    source = sources.parse(str(tmp_path / "model.safetensors"))
    same = {**source.model_fields, "padding": "same"}
    model = create_model("resnet18", num_classes=5, **same)
    model.build((None, SIZE, SIZE, 3))
    assign(model, read_weights(source, model, "resnet18"), "file", "resnet18")
    rgb = np.random.default_rng(3).uniform(0, 255, (2, SIZE, SIZE, 3)).astype("float32")
    scaled = (rgb / 255 - np.array([0.485, 0.456, 0.406])) / np.array([0.229, 0.224, 0.225])
    expected = forward(state, "resnet18", scaled.transpose(0, 3, 1, 2))
    assert relative(model(normalized(rgb, source), training=False).numpy(), expected) > 1e-2


def test_a_new_head_when_the_classes_differ_or_when_asked(tmp_path):
    state = random_state_dict("resnet18", 1000, np.random.default_rng(4))
    save_file(state, str(tmp_path / "model.safetensors"))
    source = sources.parse(str(tmp_path / "model.safetensors"))
    model, report = imported(source, "resnet18", 3)
    assert [name for name, _ in report.new["head"]] == ["logits/kernel", "logits/bias"]
    assert report.skipped[f"{source.spec}'s logits/kernel"] == (512, 1000)
    assert "head" not in report.loaded
    np.testing.assert_array_equal(
        model.stem_conv.kernel.numpy(), state["conv1.weight"].transpose(2, 3, 1, 0)
    )
    table = "\n".join(report.lines())
    assert "logits/kernel (512, 3)" in table and "(512, 1000)" in table
    _, loaded = imported(source, "resnet18", 1000)
    assert "head" in loaded.loaded and loaded.new == {}
    _, fresh = imported(source, "resnet18", 1000, init_head="new")
    assert "head" in fresh.new


def test_keras_cache_is_used_for_keras_names(tmp_path, monkeypatch):
    monkeypatch.setenv("KERAS_HOME", str(tmp_path / "keras"))
    (tmp_path / "keras" / "models").mkdir(parents=True)
    _, notop = keras_files.file_names("resnet50")
    save_like_keras_applications(
        random_keras_model("resnet50", 10), tmp_path / "keras" / "models" / notop
    )
    source = sources.parse("keras:resnet50")
    assert source.model_fields == sources.KERAS_FIELDS and source.mean == sources.KERAS_MEAN
    weights = read_weights(source, _model("resnet50", source), "resnet50")
    assert weights.layers["stage3_unit5_conv3"]["kernel"].shape == (1, 1, 256, 1024)


def test_keras_offline_without_the_file_is_one_line_and_no_download(tmp_path, monkeypatch):
    import keras

    def no_download(*args, **kwargs):  # Keras would retry it.
        raise AssertionError("the download was attempted offline")

    monkeypatch.setenv("KERAS_HOME", str(tmp_path / "keras"))
    monkeypatch.setenv(data_sources.NETWORK_PROBE_ENV, closed_port())
    monkeypatch.setattr(keras.utils, "get_file", no_download)
    with pytest.raises(
        ConfigError,
        match=r"_notop\.h5 is not in .*keras/models and the download host cannot be reached",
    ):
        read_weights(sources.parse("keras:resnet50"), _model("resnet50"), "resnet50")


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("keras:resnet50_v2", "ResNetV2 cannot be represented exactly"),
        ("keras:resnet50v2", "ResNetV2 cannot be represented exactly"),
        ("keras:resnet34", "unknown Keras applications model"),
        ("/no/such/file.h5", "no such file"),
        ("/no/such/run", "no such file or directory"),
    ],
)
def test_bad_sources_are_one_line(spec, message):
    with pytest.raises(ConfigError, match=message) as raised:
        sources.parse(spec)
    assert "\n" not in str(raised.value)


def test_a_file_of_another_depth_names_the_first_difference(tmp_path):
    save_like_keras_applications(random_keras_model("resnet50", 10), tmp_path / "weights.h5")
    source = sources.parse(str(tmp_path / "weights.h5"))
    with pytest.raises(ConfigError, match=r"^stage3 has 6 units in .*weights.h5, 23 in resnet101"):
        imported(source, "resnet101", 10)
    state = random_state_dict("resnet18", 10, np.random.default_rng(0))
    save_file(state, str(tmp_path / "r18.safetensors"))
    basic = sources.parse(str(tmp_path / "r18.safetensors"))
    with pytest.raises(ConfigError, match=r"stage1 has 2 units in .*, 3 in resnet34"):
        imported(basic, "resnet34", 10)
    with pytest.raises(
        ConfigError,
        match=r"resnet50 has layer1\.0\.conv3\.weight \(our stage1_unit0_conv3/kernel\)",
    ):
        _import_as(basic, "resnet50", units=(2, 2, 2, 2))


def _import_as(source, name, **overrides):
    model = create_model(name, num_classes=10, **source.model_fields, **overrides)
    model.build((None, SIZE, SIZE, 3))
    return assign(model, read_weights(source, model, name), source.spec, name)


@pytest.mark.parametrize("suffix", [".h5", ".safetensors"])
def test_a_corrupt_file_is_one_line(tmp_path, suffix):
    path = tmp_path / f"broken{suffix}"
    path.write_bytes(b"\x89HDF\r\n this is not a weights file" * 10)
    with pytest.raises(ConfigError, match="is not a readable") as raised:
        read_weights(sources.parse(str(path)), _model("resnet18"), "resnet18")
    assert "\n" not in str(raised.value)


def test_a_model_field_against_the_weights_is_refused():
    from resnet_app import config

    resolved = config.resolve(sets=["model.name=resnet50", "model.bn_epsilon=0.001"])
    with pytest.raises(
        ConfigError, match=r"model.bn_epsilon=0.001, but .* bn_epsilon=1.001e-05; drop"
    ):
        sources.adopt(resolved, sources.parse("keras:resnet50"))
    adopted = sources.adopt(
        config.resolve(sets=["model.name=resnet50"]), sources.parse("keras:resnet50")
    )
    assert adopted.model.overrides == sources.KERAS_FIELDS
    assert adopted.data.mean == sources.KERAS_MEAN and adopted.data.std == sources.KERAS_STD


def momentum_reference(w, grads, lr, factor, momentum=0.9):
    """TF1 momentum, by hand: a = m a + g; w -= lr * factor * a."""
    a = np.zeros_like(w)
    for g in grads:
        a = momentum * a + g
        w = w - lr * factor * a
    return w


def adam_reference(w, grads, lr, b1=0.9, b2=0.999, eps=1e-7):
    m, v = np.zeros_like(w), np.zeros_like(w)
    for t, g in enumerate(grads, start=1):
        m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
        w = w - lr * np.sqrt(1 - b2**t) / (1 - b1**t) * m / (np.sqrt(v) + eps)
    return w


@pytest.mark.parametrize("kind", ["momentum", "adam"])
def test_lr_multipliers_scale_each_parts_rate_in_the_optimizers_rule(kind):
    model = create_model("tiny")
    model.build((None, 8, 8, 3))
    multipliers = parts.lr_multipliers(model, {"head": 10.0, "stem": 0.5})
    optimizer = optim.create_optimizer({"class": kind, "learning_rate": 0.01}, multipliers)
    variables = model.trainable_variables
    optimizer.build(variables)
    rng = np.random.default_rng(0)
    start = [v.numpy().astype("float64") for v in variables]
    grads = [[rng.normal(size=v.shape) for v in variables] for _ in range(3)]
    for step in grads:
        optimizer.apply_gradients(zip([g.astype("float32") for g in step], variables))
    for i, variable in enumerate(variables):
        factor = multipliers.get(variable.path, 1.0)
        history = [step[i] for step in grads]
        if kind == "momentum":
            expected = momentum_reference(start[i], history, 0.01, factor)
        else:
            expected = adam_reference(start[i], history, 0.01 * factor)
        np.testing.assert_allclose(variable.numpy(), expected, rtol=1e-5, atol=1e-5)
    assert {multipliers[v.path] for v in model.logits.weights} == {10.0}


def test_a_mean_set_by_the_user_wins_with_a_warning(caplog):
    from resnet_app import config

    resolved = config.resolve(
        sets=["model.name=resnet50", "data.mean=[1, 2, 3]", "data.std=[4, 5, 6]"]
    )
    with caplog.at_level("WARNING"):
        adopted = sources.adopt(resolved, sources.parse("keras:resnet50"))
    assert adopted.data.mean == (1, 2, 3) and adopted.data.std == (4, 5, 6)
    assert "expect mean (123.68, 116.779, 103.939)" in caplog.text


def test_a_keras3_weights_file_reproduces_keras_logits(tmp_path):
    """What `model.save_weights` writes in Keras 3 (layers numbered by class) imports exactly."""
    keras_model = random_keras_model("resnet50", 10, seed=5)
    keras_model.save_weights(str(tmp_path / "model.weights.h5"))
    source = sources.parse(str(tmp_path / "model.weights.h5"))
    ours, report = imported(source, "resnet50", 10)
    assert "head" in report.loaded
    rgb = np.random.default_rng(6).uniform(0, 255, (2, SIZE, SIZE, 3)).astype("float32")
    expected = keras_model(keras.applications.resnet.preprocess_input(rgb.copy())).numpy()
    assert relative(ours(normalized(rgb, source), training=False).numpy(), expected) <= 1e-4


@pytest.mark.parametrize("convolutions", [0, 53])
def test_a_keras3_weights_file_of_another_network_is_one_line(tmp_path, convolutions):
    """Another depth is refused before any model is built; another network of ResNet-50's
    depth (53 convolutions) when its weights do not load."""
    convs = [keras.layers.Conv2D(1, 1) for _ in range(convolutions)]
    other = keras.Sequential([keras.Input((4, 4, 1)), *convs, keras.layers.Dense(3)])
    other.save_weights(str(tmp_path / "other.weights.h5"))
    with pytest.raises(ConfigError, match="of none of Keras applications' ResNet50") as raised:
        read_weights(sources.parse(str(tmp_path / "other.weights.h5")), _model("resnet50"), "r")
    assert f"(it holds {convolutions} convolutions; they hold 53, 104, 155)" in str(raised.value)
    assert "\n" not in str(raised.value)


def _model(name, source=None, num_classes=10):
    fields = source.model_fields if source is not None else {}
    model = create_model(name, num_classes=num_classes, **fields)
    model.build((None, SIZE, SIZE, 3))
    return model
