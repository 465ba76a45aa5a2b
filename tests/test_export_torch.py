"""`export --format=timm` and `--format=torchvision`: the state dict is the exact inverse of the
import maps (each tensor back bitwise through `--init_from`'s reader), in the libraries'
layouts; the command writes both files, their constructor entries and parity rows; networks
a library cannot build are refused in one line. The real libraries load these files in
scripts/torch_parity.py (a venv with torch), not here."""

import json
import types

import numpy as np
import pytest
import tensorflow as tf
from safetensors.numpy import load_file, save_file

from resnet_app import pretrained
from resnet_app.common.errors import ConfigError
from resnet_app.export import torch_weights
from resnet_app.nets import parts
from resnet_app.nets.resnet import create_model
from resnet_app.pretrained import sources
from tests.commands import error_line, run_command


def random_network(name, classes=7, size=32):
    model = create_model(name, num_classes=classes, **sources.TORCHVISION_FIELDS)
    model.build((None, size, size, 3))
    rng = np.random.default_rng(0)
    for variable in model.weights:
        variable.assign(rng.normal(size=variable.shape).astype(np.float32))
    return model


@pytest.mark.parametrize("name", ["resnet18", "seresnext50_32x4d", "ecaresnet50d", "resnetrs50"])
def test_an_exported_state_dict_reads_back_bitwise(name, tmp_path):
    model = random_network(name)
    path = str(tmp_path / "model.safetensors")
    save_file(torch_weights.state_dict(model), path)
    fresh = create_model(name, num_classes=7, **sources.TORCHVISION_FIELDS)
    fresh.build((None, 32, 32, 3))
    read = pretrained.read_weights(sources.parse(path), fresh, name)  # As --init_from reads.
    ours = parts.get_weights(model)
    assert set(read.layers) == set(ours)
    for layer, values in ours.items():
        for short, value in values.items():
            np.testing.assert_array_equal(read.layers[layer][short], value)
    tensors = load_file(path)
    bn = [key for key in tensors if key.endswith(".running_var")]
    assert len([key for key in tensors if key.endswith(".num_batches_tracked")]) == len(bn)


def test_the_libraries_layouts():
    """PyTorch's shapes, written out by hand: OIHW convolutions, [out, in] linear layers,
    timm's SE as 1x1 convolutions with bias, ECA's Conv1d."""
    shapes = {}
    for name in ("resnet18", "seresnext50_32x4d", "ecaresnet50d"):
        tensors = torch_weights.state_dict(random_network(name))
        shapes[name] = {key: value.shape for key, value in tensors.items()}
    assert shapes["resnet18"]["conv1.weight"] == (64, 3, 7, 7)
    assert shapes["resnet18"]["layer2.0.downsample.0.weight"] == (128, 64, 1, 1)
    assert shapes["resnet18"]["fc.weight"] == (7, 512) and shapes["resnet18"]["fc.bias"] == (7,)
    assert shapes["resnet18"]["bn1.num_batches_tracked"] == ()
    # seresnext50_32x4d: 32 groups of 4 channels at width 128 in stage 1, SE of 256 -> 16.
    assert shapes["seresnext50_32x4d"]["layer1.0.conv2.weight"] == (128, 4, 3, 3)
    assert shapes["seresnext50_32x4d"]["layer1.0.se.fc1.weight"] == (16, 256, 1, 1)
    assert shapes["seresnext50_32x4d"]["layer1.0.se.fc1.bias"] == (16,)
    assert shapes["ecaresnet50d"]["layer1.0.se.conv.weight"] == (1, 1, 5)
    # ResNet-D's shortcut: an average pool, then the 1x1 convolution as downsample.1.
    assert shapes["ecaresnet50d"]["layer2.0.downsample.1.weight"] == (512, 256, 1, 1)


def classifier_of(model):
    prep = types.SimpleNamespace(channels=3, mean=[127.5] * 3, std=[63.75] * 3)
    return types.SimpleNamespace(model=model, preprocessing=prep)


@pytest.mark.parametrize(
    "library, name, message",
    [
        ("torchvision", "resnet50d", "torchvision has no resnet50d; its nearest is resnet50"),
        ("timm", "resnet50_v2", "timm has no resnet50_v2; its nearest is resnet50"),
        ("timm", "resnet20", "timm has no resnet20"),
    ],
)
def test_a_network_the_library_lacks_is_refused_naming_the_nearest(library, name, message):
    model = create_model(name, num_classes=10)
    with pytest.raises(ConfigError, match=message):
        torch_weights.Library(library).constructor(classifier_of(model), {})


def test_a_network_the_library_builds_otherwise_names_the_setting():
    model = create_model("resnet18", num_classes=10)  # Our default: TF's "same" padding.
    with pytest.raises(ConfigError, match=r"model.padding='same' but timm's has 'symmetric'"):
        torch_weights.TIMM.constructor(classifier_of(model), {})


@pytest.fixture(scope="module")
def symmetric_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("torch_export")
    model_dir = root / "run"
    result = run_command(
        "resnet_app.train",
        "--model=resnet18",
        "--set=model.padding=symmetric",
        "--set=data.image_size=32",
        f"--set=data.data_dir={root / 'data'}",
        "--set=data.train_examples=64",
        "--set=data.eval_examples=24",
        "--batch_size=16",
        "--train_steps=2",
        f"--model_dir={model_dir}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return model_dir


def test_the_export_writes_both_libraries_with_parity(symmetric_run, tmp_path):
    export = tmp_path / "export"
    result = run_command(
        "resnet_app.export",
        f"--model_dir={symmetric_run}",
        f"--export_dir={export}",
        "--format=timm,torchvision",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    info = json.loads((export / "model_info.json").read_text())
    assert info["timm"]["create_model"] == {"model_name": "resnet18", "num_classes": 10,
                                             "in_chans": 3}  # fmt: skip
    assert info["torchvision"]["architecture"] == "resnet18"
    assert info["torchvision"]["input_size"] == [3, 32, 32]
    np.testing.assert_allclose(np.array(info["timm"]["mean"]) * 255, info["preprocessing"]["mean"])
    rows = {
        row["format"]: row
        for row in json.loads((export / "export_report.json").read_text())["formats"]
    }
    for library in ("timm", "torchvision"):  # Read back into our network: the same function.
        assert rows[library]["agreement"] == 1.0
        assert rows[library]["max_prob_diff"] <= 1e-5
    # The checkpoint's weights, bitwise, in the file.
    model = create_model("resnet18", num_classes=10, **sources.TORCHVISION_FIELDS)
    model.build((None, 32, 32, 3))
    tf.train.Checkpoint(model=model).restore(str(symmetric_run / "ckpt-2")).expect_partial()
    tensors = load_file(str(export / info["timm"]["file"]))
    np.testing.assert_array_equal(tensors["fc.weight"], model.logits.kernel.numpy().T)
    np.testing.assert_array_equal(
        tensors["layer1.0.bn1.running_var"],
        parts.named_layers(model)["stage1_unit0_bn1"].moving_variance.numpy(),
    )


def test_the_export_refuses_a_network_timm_lacks_in_one_line(tiny_run, tmp_path):
    _, model_dir = tiny_run
    line = error_line(
        run_command(
            "resnet_app.export",
            f"--model_dir={model_dir}",
            f"--export_dir={tmp_path / 'x'}",
            "--format=timm",
        )
    )
    assert "timm has no tiny; its nearest is" in line
    assert not (tmp_path / "x").exists()  # Nothing half-written.
