"""Self-checks of the NumPy torchvision ResNet reference (no TensorFlow).

The convolution and pooling against naive loops, the state dict against
torchvision's published tensor and parameter counts, and the forward pass's
shapes, scale and independence of the examples of a batch.
"""

import numpy as np
import pytest

from tests import torchvision_reference as tvr

# torchvision's published parameter counts (num_classes=1000).
PUBLISHED_PARAMS = {
    "resnet18": 11_689_512,
    "resnet34": 21_797_672,
    "resnet50": 25_557_032,
    "resnet101": 44_549_160,
    "resnet152": 60_192_808,
}


def _is_parameter(name: str) -> bool:
    return name.endswith((".weight", ".bias"))


def naive_conv2d(x, weight, stride, padding, groups=1):
    """Direct sum over every output position and the input channels of its group."""
    batch, channels, height, width = x.shape
    out_channels, group_channels, kernel_h, kernel_w = weight.shape
    per_group = out_channels // groups
    out_h = (height + 2 * padding - kernel_h) // stride + 1
    out_w = (width + 2 * padding - kernel_w) // stride + 1
    out = np.zeros((batch, out_channels, out_h, out_w))
    for n in range(batch):
        for o in range(out_channels):
            first = (o // per_group) * group_channels
            for i in range(out_h):
                for j in range(out_w):
                    total = 0.0
                    for c in range(group_channels):
                        for di in range(kernel_h):
                            for dj in range(kernel_w):
                                row = i * stride + di - padding
                                col = j * stride + dj - padding
                                if 0 <= row < height and 0 <= col < width:
                                    total += x[n, first + c, row, col] * weight[o, c, di, dj]
                    out[n, o, i, j] = total
    return out


@pytest.mark.parametrize(
    "kernel,stride,padding",
    [(1, 1, 0), (1, 2, 0), (3, 1, 1), (3, 2, 1), (3, 2, 0), (7, 1, 3), (7, 2, 3)],
)
def test_conv2d_matches_naive_loop(kernel, stride, padding):
    rng = np.random.default_rng(kernel * 10 + stride)
    x = rng.standard_normal((2, 3, 11, 10))  # Odd and even sizes, not square.
    weight = rng.standard_normal((4, 3, kernel, kernel))
    got = tvr.conv2d(x, weight, stride=stride, padding=padding)
    want = naive_conv2d(x, weight, stride, padding)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_max_pool_matches_naive_loop():
    rng = np.random.default_rng(1)
    # All negative: padding with zeros instead of -inf would change the borders.
    x = rng.standard_normal((2, 3, 9, 8)) - 10.0
    got = tvr.max_pool_3x3_s2(x)
    batch, channels, height, width = x.shape
    out_h, out_w = (height - 1) // 2 + 1, (width - 1) // 2 + 1  # (size + 2 - 3) // 2 + 1
    want = np.full((batch, channels, out_h, out_w), -np.inf)
    for i in range(out_h):
        for j in range(out_w):
            for di in range(3):
                for dj in range(3):
                    row, col = 2 * i + di - 1, 2 * j + dj - 1
                    if 0 <= row < height and 0 <= col < width:
                        want[:, :, i, j] = np.maximum(want[:, :, i, j], x[:, :, row, col])
    assert got.shape == (2, 3, 5, 4)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("arch", ["resnet18", "resnet50"])
def test_forward_output_shape(arch):
    rng = np.random.default_rng(2)
    state = tvr.random_state_dict(arch, 10, rng)
    logits = tvr.forward(state, arch, rng.standard_normal((2, 3, 64, 64)).astype(np.float32))
    assert logits.shape == (2, 10)
    assert logits.dtype == np.float64
    assert np.all(np.isfinite(logits))


@pytest.mark.parametrize("arch,parameters,entries", [("resnet18", 62, 122), ("resnet50", 161, 320)])
def test_state_dict_names_and_counts(arch, parameters, entries):
    # resnet18: stem 3 + 8 blocks * 6 + 3 downsamples * 3 + fc 2 = 62 parameters,
    # and 20 BatchNorms * 3 buffers. resnet50: 3 + 16 * 9 + 4 * 3 + 2 = 161, 53 BNs.
    state = tvr.random_state_dict(arch, 1000, np.random.default_rng(3))
    assert sum(_is_parameter(name) for name in state) == parameters
    assert len(state) == entries
    assert list(state)[:7] == [
        "conv1.weight",
        "bn1.weight",
        "bn1.bias",
        "bn1.running_mean",
        "bn1.running_var",
        "bn1.num_batches_tracked",
        "layer1.0.conv1.weight",
    ]
    assert list(state)[-2:] == ["fc.weight", "fc.bias"]
    for name, value in state.items():
        if name.endswith(".num_batches_tracked"):
            assert value.dtype == np.int64 and value.shape == ()
        else:
            assert value.dtype == np.float32, name
    assert state["conv1.weight"].shape == (64, 3, 7, 7)
    assert state["layer2.0.downsample.0.weight"].shape[2:] == (1, 1)
    assert "layer2.1.downsample.0.weight" not in state
    if arch == "resnet18":
        assert "layer1.0.downsample.0.weight" not in state  # 64 -> 64, stride 1.
        assert state["layer2.0.conv1.weight"].shape == (128, 64, 3, 3)
        assert state["layer2.0.downsample.0.weight"].shape == (128, 64, 1, 1)
        assert "layer1.0.conv3.weight" not in state
        assert state["fc.weight"].shape == (1000, 512)
    else:
        assert state["layer1.0.downsample.0.weight"].shape == (256, 64, 1, 1)  # 64 -> 256.
        assert state["layer1.0.downsample.1.running_var"].shape == (256,)
        assert state["layer2.0.conv1.weight"].shape == (128, 256, 1, 1)
        assert state["layer2.0.conv2.weight"].shape == (128, 128, 3, 3)
        assert state["layer2.0.conv3.weight"].shape == (512, 128, 1, 1)
        assert state["layer4.2.bn3.weight"].shape == (2048,)
        assert state["fc.weight"].shape == (1000, 2048)
    assert state["fc.bias"].shape == (1000,)


@pytest.mark.parametrize("arch", sorted(PUBLISHED_PARAMS))
def test_parameter_count_is_torchvisions(arch):
    shapes = tvr.state_dict_shapes(arch, 1000)
    count = sum(int(np.prod(shape)) for name, shape in shapes.items() if _is_parameter(name))
    assert count == PUBLISHED_PARAMS[arch]


def test_random_state_dict_has_the_shapes_and_nontrivial_values():
    state = tvr.random_state_dict("resnet18", 7, np.random.default_rng(4))
    assert {name: value.shape for name, value in state.items()} == tvr.state_dict_shapes(
        "resnet18", 7
    )
    for name, value in state.items():
        if value.ndim:
            assert np.std(value) > 0.01, name
            assert not np.allclose(value, 1.0), name
        if name.endswith("running_var"):
            assert value.min() >= 0.5, name


@pytest.mark.parametrize("arch", ["resnet18", "resnet152"])
def test_activations_stay_order_one(arch):
    rng = np.random.default_rng(5)
    state = tvr.random_state_dict(arch, 10, rng)
    logits = tvr.forward(state, arch, rng.standard_normal((2, 3, 32, 32)))
    assert 0.3 < np.std(logits) < 20
    # The examples still differ: the output depends on the input.
    assert np.std(logits[0] - logits[1]) > 0.05


def test_examples_are_independent():
    rng = np.random.default_rng(6)
    state = tvr.random_state_dict("resnet18", 5, rng)
    images = rng.standard_normal((3, 3, 40, 48))
    together = tvr.forward(state, "resnet18", images)
    apart = np.concatenate([tvr.forward(state, "resnet18", image[None]) for image in images])
    np.testing.assert_allclose(together, apart, rtol=1e-12, atol=1e-12)


def test_forward_rejects_a_mismatched_state():
    rng = np.random.default_rng(7)
    state = tvr.random_state_dict("resnet18", 5, rng)
    images = rng.standard_normal((1, 3, 32, 32))
    transposed = dict(state, **{"fc.weight": state["fc.weight"].T})
    with pytest.raises(ValueError, match="fc.weight"):
        tvr.forward(transposed, "resnet18", images)
    missing = {name: value for name, value in state.items() if name != "bn1.running_var"}
    with pytest.raises(ValueError, match="bn1.running_var"):
        tvr.forward(missing, "resnet18", images)
    with pytest.raises(ValueError, match=r"missing \[.layer1\.2\."):  # resnet34 has 3 blocks.
        tvr.forward(state, "resnet34", images)
