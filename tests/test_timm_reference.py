"""Self-checks of the NumPy torchvision/timm ResNet-family reference (no TensorFlow).

The grouped convolution, the ceil-mode average pool, SE and ECA against naive
loops; the state dicts against the published parameter counts and names; the
forward pass's shapes, scale, independence of the examples of a batch, and
agreement with `tests.torchvision_reference` where the variants reduce to
torchvision's plain ResNet.
"""

import math

import numpy as np
import pytest

from tests import timm_reference as tr
from tests import torchvision_reference as tvr
from tests.test_torchvision_reference import naive_conv2d

# For the others no exact count was at hand: these are the `param_count`
# column (millions, 2 decimals) of timm's results/results-imagenet.csv, and for
# seresnet101 / seresnet152 (no pretrained weights, so not in that file) of
# results/benchmark-infer-amp-nchw-pt240-cu124-rtx3090.csv. The exact numbers
# would come from `sum(p.numel() for p in timm.create_model(name).parameters())`.
PUBLISHED_MILLIONS = {
    "resnet101d": 44.57,
    "resnet152d": 60.21,
    "resnet200d": 64.69,
    "seresnet101": 49.33,
    "seresnet152": 66.82,
    "seresnext101_32x8d": 93.57,
    "ecaresnet101d": 44.57,
    "resnetrs152": 86.62,
    "resnetrs200": 93.21,
    "resnetrs270": 129.86,
    "resnetrs350": 163.96,
    "resnetrs420": 191.89,
}


@pytest.mark.parametrize(
    "groups,in_channels,out_channels,kernel,stride,padding",
    [
        (1, 4, 6, 3, 1, 1),
        (2, 4, 6, 3, 2, 1),
        (4, 8, 8, 3, 2, 1),  # ResNeXt's case: groups | C, square.
        (3, 6, 9, 1, 2, 0),
        (8, 8, 8, 3, 1, 1),  # Depthwise.
    ],
)
@pytest.mark.parametrize("size", [(7, 6), (8, 9)])
def test_grouped_conv2d_matches_naive_loop(
    groups, in_channels, out_channels, kernel, stride, padding, size
):
    rng = np.random.default_rng(groups * 100 + in_channels + size[0])
    x = rng.standard_normal((2, in_channels, *size))
    weight = rng.standard_normal((out_channels, in_channels // groups, kernel, kernel))
    got = tvr.conv2d(x, weight, stride=stride, padding=padding, groups=groups)
    want = naive_conv2d(x, weight, stride, padding, groups)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_grouped_conv2d_rejects_mismatched_channels():
    x = np.zeros((1, 6, 4, 4))
    with pytest.raises(ValueError, match="groups=4"):
        tvr.conv2d(x, np.zeros((8, 2, 3, 3)), groups=4)  # 4 does not divide 6.
    with pytest.raises(ValueError, match="weight expects 4"):
        tvr.conv2d(x, np.zeros((8, 2, 3, 3)), groups=2)


def naive_avg_pool_ceil(x, kernel, stride):
    """Every window that starts inside the input, averaged over its elements inside."""
    batch, channels, height, width = x.shape
    starts_h = list(range(0, height, stride))
    starts_w = list(range(0, width, stride))
    # ceil_mode keeps a window that overhangs the end, but only the first such one.
    starts_h = [s for s in starts_h if s + kernel <= height or s - stride + kernel < height]
    starts_w = [s for s in starts_w if s + kernel <= width or s - stride + kernel < width]
    out = np.zeros((batch, channels, len(starts_h), len(starts_w)))
    for i, top in enumerate(starts_h):
        for j, left in enumerate(starts_w):
            total, count = 0.0, 0
            for row in range(top, min(top + kernel, height)):
                for col in range(left, min(left + kernel, width)):
                    total = total + x[:, :, row, col]
                    count += 1
            out[:, :, i, j] = total / count
    return out


@pytest.mark.parametrize("size", [(6, 8), (7, 5), (3, 3), (4, 7), (9, 4)])
@pytest.mark.parametrize("kernel,stride", [(2, 2), (3, 2), (2, 1)])
def test_avg_pool_ceil_matches_naive_loop(size, kernel, stride):
    rng = np.random.default_rng(size[0] * 10 + size[1])
    x = rng.standard_normal((2, 3, *size))
    got = tr.avg_pool_ceil(x, kernel, stride)
    want = naive_avg_pool_ceil(x, kernel, stride)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_avg_pool_ceil_averages_valid_elements_of_the_last_window():
    x = np.arange(25, dtype=np.float64).reshape(1, 1, 5, 5)
    got = tr.avg_pool_ceil(x, 2, 2)
    assert got.shape == (1, 1, 3, 3)  # ceil(5 / 2), not floor.
    assert got[0, 0, 0, 0] == (0 + 1 + 5 + 6) / 4
    assert got[0, 0, 0, 2] == (4 + 9) / 2  # Not divided by 4: count_include_pad=False.
    assert got[0, 0, 2, 2] == 24.0


def test_squeeze_excite_matches_hand_loop():
    rng = np.random.default_rng(8)
    x = rng.standard_normal((2, 6, 3, 4))
    fc1_w, fc1_b = rng.standard_normal((2, 6, 1, 1)), rng.standard_normal(2)
    fc2_w, fc2_b = rng.standard_normal((6, 2, 1, 1)), rng.standard_normal(6)
    want = np.zeros_like(x)
    for n in range(2):
        mean = [sum(x[n, c, i, j] for i in range(3) for j in range(4)) / 12 for c in range(6)]
        hidden = [
            max(0.0, sum(fc1_w[r, c, 0, 0] * mean[c] for c in range(6)) + fc1_b[r])
            for r in range(2)
        ]
        for c in range(6):
            logit = sum(fc2_w[c, r, 0, 0] * hidden[r] for r in range(2)) + fc2_b[c]
            want[n, c] = x[n, c] / (1.0 + math.exp(-logit))
    got = tr.squeeze_excite(x, fc1_w, fc1_b, fc2_w, fc2_b)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kernel", [3, 5])
def test_efficient_channel_attention_matches_hand_loop(kernel):
    rng = np.random.default_rng(9)
    channels = 7
    x = rng.standard_normal((2, channels, 3, 2))
    weight = rng.standard_normal((1, 1, kernel))
    pad = (kernel - 1) // 2
    want = np.zeros_like(x)
    for n in range(2):
        mean = [x[n, c].sum() / 6 for c in range(channels)]
        for c in range(channels):
            logit = 0.0
            for k in range(kernel):
                source = c + k - pad  # Zero padding at both ends of the channel axis.
                if 0 <= source < channels:
                    logit += weight[0, 0, k] * mean[source]
            want[n, c] = x[n, c] / (1.0 + math.exp(-logit))
    got = tr.efficient_channel_attention(x, weight)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_eca_kernel_sizes():
    assert [tr.eca_kernel_size(c) for c in (256, 512, 1024, 2048)] == [5, 5, 5, 7]
    assert [tr.eca_kernel_size(c) for c in (1, 8, 64, 128)] == [3, 3, 3, 5]
    shapes = tr.state_dict_shapes("ecaresnet50d")
    assert shapes["layer1.0.se.conv.weight"] == (1, 1, 5)
    assert shapes["layer4.2.se.conv.weight"] == (1, 1, 7)


def test_make_divisible_and_se_widths():
    assert tr.make_divisible(16.0, 8, round_limit=0.0) == 16
    assert tr.make_divisible(11.0, 8, round_limit=0.0) == 8  # Rounds down, nearest.
    assert tr.make_divisible(12.0, 8, round_limit=0.0) == 16  # Halves round up.
    assert tr.make_divisible(3.0, 8, round_limit=0.0) == 8  # At least the divisor.
    assert tr.make_divisible(11.0, 8) == 16  # round_limit 0.9: 8 < 0.9 * 11.
    assert [tr.se_channels(c) for c in (256, 512, 1024, 2048)] == [16, 32, 64, 128]
    assert tr.se_channels(256, 0.25) == 64


@pytest.mark.parametrize("arch", sorted(tr.PUBLISHED_PARAMS))
def test_trainable_params_are_published_counts(arch):
    assert tr.trainable_params(arch, 1000) == tr.PUBLISHED_PARAMS[arch]


@pytest.mark.parametrize("arch", sorted(PUBLISHED_MILLIONS))
def test_trainable_params_match_timms_rounded_counts(arch):
    assert round(tr.trainable_params(arch, 1000) / 1e6, 2) == PUBLISHED_MILLIONS[arch]


def test_every_arch_has_a_count():
    assert set(tr.PUBLISHED_PARAMS) | set(PUBLISHED_MILLIONS) == set(tr.ARCHS)
    assert {spec.source for spec in tr.ARCHS.values()} == {"torchvision", "timm"}


def test_trainable_params_leave_out_buffers_and_follow_num_classes():
    shapes = tr.state_dict_shapes("resnet18d", 10)
    everything = sum(math.prod(shape) for shape in shapes.values())
    buffers = sum(
        math.prod(shape)
        for name, shape in shapes.items()
        if name.endswith(("running_mean", "running_var", "num_batches_tracked"))
    )
    assert tr.trainable_params("resnet18d", 10) == everything - buffers
    assert tr.trainable_params("resnet18d", 1000) - tr.trainable_params("resnet18d", 10) == (
        990 * 513
    )


def test_torchvision_layout_names():
    shapes = tr.state_dict_shapes("resnext50_32x4d")
    assert list(shapes)[:7] == [
        "conv1.weight",
        "bn1.weight",
        "bn1.bias",
        "bn1.running_mean",
        "bn1.running_var",
        "bn1.num_batches_tracked",
        "layer1.0.conv1.weight",
    ]
    assert shapes["conv1.weight"] == (64, 3, 7, 7)
    assert shapes["layer1.0.conv1.weight"] == (128, 64, 1, 1)  # int(64 * 4 / 64) * 32.
    assert shapes["layer1.0.conv2.weight"] == (128, 4, 3, 3)  # Grouped: 128 / 32 inputs.
    assert shapes["layer1.0.conv3.weight"] == (256, 128, 1, 1)
    assert shapes["layer1.0.downsample.0.weight"] == (256, 64, 1, 1)
    assert shapes["layer4.0.conv2.weight"] == (1024, 32, 3, 3)
    assert shapes["layer2.0.downsample.1.num_batches_tracked"] == ()
    assert not any(".se." in name or "conv1.0" in name for name in shapes)
    wide = tr.state_dict_shapes("wide_resnet50_2")
    assert wide["layer4.2.conv2.weight"] == (1024, 1024, 3, 3)
    assert wide["layer4.2.conv3.weight"] == (2048, 1024, 1, 1)
    assert tr.state_dict_shapes("resnext101_32x8d")["layer1.0.conv2.weight"] == (256, 8, 3, 3)
    assert tr.state_dict_shapes("resnext101_64x4d")["layer3.22.conv2.weight"] == (1024, 16, 3, 3)


def test_timm_deep_stem_avg_down_and_se_names():
    shapes = tr.state_dict_shapes("resnetrs50", 1000)
    names = list(shapes)
    stem = [name for name in names if not name.startswith(("layer", "fc"))]
    assert [name for name in stem if name.endswith(".weight")] == [
        "conv1.0.weight",
        "conv1.1.weight",
        "conv1.3.weight",
        "conv1.4.weight",
        "conv1.6.weight",
        "bn1.weight",
        "maxpool.0.weight",
        "maxpool.1.weight",
    ]
    assert shapes["conv1.0.weight"] == (32, 3, 3, 3)
    assert shapes["conv1.3.weight"] == (32, 32, 3, 3)
    assert shapes["conv1.6.weight"] == (64, 32, 3, 3)
    assert shapes["bn1.weight"] == (64,)
    assert shapes["maxpool.0.weight"] == (64, 64, 3, 3)
    # A block: convs and BNs, then `se`, then `downsample` (pool, conv, BN).
    block = [name[len("layer2.0.") :] for name in names if name.startswith("layer2.0.")]
    assert [name for name in block if not name.startswith(("bn", "downsample.2"))] == [
        "conv1.weight",
        "conv2.weight",
        "conv3.weight",
        "se.fc1.weight",
        "se.fc1.bias",
        "se.fc2.weight",
        "se.fc2.bias",
        "downsample.1.weight",
    ]
    assert shapes["layer2.0.se.fc1.weight"] == (128, 512, 1, 1)  # rd_ratio 0.25.
    assert shapes["layer2.0.se.fc2.bias"] == (512,)
    assert shapes["layer2.0.downsample.1.weight"] == (512, 256, 1, 1)
    assert shapes["layer2.0.downsample.2.running_var"] == (512,)
    assert "layer1.0.downsample.1.weight" in shapes  # Identity pool at [0], stride 1.
    assert not any("downsample.0" in name for name in names)
    assert shapes["layer4.2.se.fc1.weight"] == (512, 2048, 1, 1)
    se = tr.state_dict_shapes("seresnet50")
    assert se["layer4.2.se.fc1.weight"] == (128, 2048, 1, 1)  # 1/16.
    assert se["layer1.0.downsample.0.weight"] == (256, 64, 1, 1)
    assert se["conv1.weight"] == (64, 3, 7, 7)
    assert "maxpool.0.weight" not in se
    assert tr.state_dict_shapes("resnet50s")["conv1.6.weight"] == (128, 64, 3, 3)
    assert "layer2.0.downsample.0.weight" in tr.state_dict_shapes("resnet50c")
    basic = tr.state_dict_shapes("resnet18d")
    assert "layer1.0.downsample.1.weight" not in basic  # 64 -> 64, stride 1.
    assert basic["layer2.0.downsample.1.weight"] == (128, 64, 1, 1)
    assert basic["fc.weight"] == (1000, 512)


def test_random_state_dict_follows_the_shapes():
    state = tr.random_state_dict("ecaresnet50d", 7, np.random.default_rng(4))
    shapes = tr.state_dict_shapes("ecaresnet50d", 7)
    assert list(state) == list(shapes)
    assert {name: value.shape for name, value in state.items()} == shapes
    for name, value in state.items():
        if name.endswith(".num_batches_tracked"):
            assert value.dtype == np.int64 and value.shape == ()
            continue
        assert value.dtype == np.float32, name
        if value.size > 1:
            assert np.std(value) > 0.01, name
        if name.endswith("running_var"):
            assert value.min() >= 0.5, name


@pytest.mark.parametrize(
    "arch,size",
    [
        ("resnext50_32x4d", 32),
        ("wide_resnet50_2", 32),
        ("resnet18d", 33),  # Odd sizes through the ceil-mode pool.
        ("resnet50c", 40),
        ("seresnext50_32x4d", 32),
        ("ecaresnet50d", 35),
        ("resnetrs50", 37),
    ],
)
def test_forward_shapes_and_scale(arch, size):
    rng = np.random.default_rng(2)
    state = tr.random_state_dict(arch, 10, rng)
    images = rng.standard_normal((2, 3, size, size)).astype(np.float32)
    logits, features = tr.forward(state, arch, images, return_features=True)
    channels = 512 if tr.ARCHS[arch].block == "basic" else 2048
    assert logits.shape == (2, 10) and logits.dtype == np.float64
    assert features.shape == (2, channels) and features.dtype == np.float64
    assert np.all(np.isfinite(logits))
    assert 0.3 < np.std(logits) < 20
    assert 0.1 < np.mean(features) < 20 and features.min() >= 0.0  # Pooled after a ReLU.
    np.testing.assert_allclose(
        logits, features @ state["fc.weight"].T.astype(np.float64) + state["fc.bias"]
    )
    np.testing.assert_array_equal(tr.forward(state, arch, images), logits)


@pytest.mark.parametrize("arch", ["resnet152d", "resnetrs101"])
def test_deep_nets_stay_order_one(arch):
    rng = np.random.default_rng(5)
    state = tr.random_state_dict(arch, 10, rng)
    logits = tr.forward(state, arch, rng.standard_normal((2, 3, 32, 32)))
    assert 0.3 < np.std(logits) < 20
    assert np.std(logits[0] - logits[1]) > 0.02  # The output depends on the input.


def test_examples_are_independent():
    rng = np.random.default_rng(6)
    state = tr.random_state_dict("seresnext50_32x4d", 5, rng)
    images = rng.standard_normal((3, 3, 32, 40))
    together = tr.forward(state, "seresnext50_32x4d", images)
    apart = np.concatenate(
        [tr.forward(state, "seresnext50_32x4d", image[None]) for image in images]
    )
    np.testing.assert_allclose(together, apart, rtol=1e-10, atol=1e-12)


def test_reduces_to_torchvision_resnet(monkeypatch):
    # The plain arguments give torchvision's resnet: same names, order, logits.
    monkeypatch.setitem(tr.ARCHS, "resnet18", tr.Arch("torchvision", "basic", (2, 2, 2, 2)))
    monkeypatch.setitem(tr.ARCHS, "resnet50", tr.Arch("torchvision", "bottleneck", (3, 4, 6, 3)))
    assert list(tr.state_dict_shapes("resnet50").items()) == list(
        tvr.state_dict_shapes("resnet50").items()
    )
    rng = np.random.default_rng(10)
    images = rng.standard_normal((2, 3, 32, 32))
    state = tr.random_state_dict("resnet18", 5, rng)
    assert list(state) == list(tvr.state_dict_shapes("resnet18", 5))
    np.testing.assert_allclose(
        tr.forward(state, "resnet18", images), tvr.forward(state, "resnet18", images), rtol=1e-12
    )


def test_se_gate_of_one_is_the_plain_net_and_of_one_half_halves_the_branch(monkeypatch):
    # seresnet50 with fc2 = 0 and a large bias: every gate is 1 (to 1e-22), the
    # net is torchvision's resnet50 on the same tensors, without `se`.
    rng = np.random.default_rng(11)
    images = rng.standard_normal((2, 3, 32, 32))
    state = tr.random_state_dict("seresnet50", 5, rng)
    for name in state:
        if ".se.fc2." in name:
            state[name] = np.full_like(state[name], 50.0 if name.endswith("bias") else 0.0)
    plain = {name: value for name, value in state.items() if ".se." not in name}
    np.testing.assert_allclose(
        tr.forward(state, "seresnet50", images), tvr.forward(plain, "resnet50", images), rtol=1e-10
    )
    # Gate 1/2 everywhere: as torchvision's resnet50 with every bn3 halved.
    for name in state:
        if ".se.fc2.bias" in name:
            state[name] = np.zeros_like(state[name])
    halved = dict(plain)
    for name in plain:
        if ".bn3." in name and name.endswith(("weight", "bias")):
            halved[name] = plain[name] * np.float32(0.5)
    np.testing.assert_allclose(
        tr.forward(state, "seresnet50", images), tvr.forward(halved, "resnet50", images), rtol=1e-6
    )


def test_forward_rejects_a_mismatched_state():
    rng = np.random.default_rng(7)
    state = tr.random_state_dict("resnet18d", 5, rng)
    images = rng.standard_normal((1, 3, 32, 32))
    misshapen = dict(state, **{"layer1.0.conv2.weight": state["layer1.0.conv2.weight"][:, :32]})
    with pytest.raises(ValueError, match=r"layer1\.0\.conv2\.weight: shape"):
        tr.forward(misshapen, "resnet18d", images)
    missing = {name: value for name, value in state.items() if name != "conv1.4.running_var"}
    with pytest.raises(ValueError, match=r"missing \['conv1\.4\.running_var'\]"):
        tr.forward(missing, "resnet18d", images)
    extra = dict(state, **{"layer1.0.se.conv.weight": np.ones((1, 1, 3), np.float32)})
    with pytest.raises(ValueError, match=r"unexpected \['layer1\.0\.se\.conv\.weight'\]"):
        tr.forward(extra, "resnet18d", images)
    with pytest.raises(ValueError, match=r"missing \[.layer1\.2\."):  # resnet34d: 3 blocks.
        tr.forward(state, "resnet34d", images)
    with pytest.raises(ValueError, match="fc.weight"):
        tr.forward({k: v for k, v in state.items() if k != "fc.weight"}, "resnet18d", images)
    with pytest.raises(ValueError, match="unknown arch"):
        tr.forward(state, "resnet18", images)
    with pytest.raises(ValueError, match="images"):
        tr.forward(state, "resnet18d", images[:, :1])
