"""Mixup and CutMix against NumPy for given draws; the draws' distribution; bad settings."""

import numpy as np
import pytest
import tensorflow as tf

from resnet_app.common.errors import ConfigError
from resnet_app.data import mixing
from resnet_app.data.settings import data_config


def numpy_mix(images, labels, cutmix, lam, centre):
    """The mixed batch, written from the papers' definitions (Zhang 2018, Yun 2019)."""
    count, height, width = images.shape[:3]
    out, dominant, other, share = images.copy(), labels.copy(), labels.copy(), np.zeros(count)
    for i in range(count):
        j = count - 1 - i
        if cutmix[i]:
            ratio = np.sqrt(1 - lam[i])
            cy, cx = centre[i][0] * height, centre[i][1] * width
            top = int(np.clip(np.round(cy - ratio * height / 2), 0, height))
            bottom = int(np.clip(np.round(cy + ratio * height / 2), 0, height))
            left = int(np.clip(np.round(cx - ratio * width / 2), 0, width))
            right = int(np.clip(np.round(cx + ratio * width / 2), 0, width))
            out[i, top:bottom, left:right] = images[j, top:bottom, left:right]
            mine = 1 - (bottom - top) * (right - left) / (height * width)
        else:
            out[i] = lam[i] * images[i] + (1 - lam[i]) * images[j]
            mine = lam[i]
        if mine >= 0.5:
            dominant[i], other[i], share[i] = labels[i], labels[j], mine
        else:
            dominant[i], other[i], share[i] = labels[j], labels[i], 1 - mine
    return out, dominant, other, share


@pytest.mark.parametrize("mode", ["batch", "example"])
@pytest.mark.parametrize("alphas", [(0.2, 0.0), (0.0, 1.0), (0.8, 1.0)])
def test_mixed_batch_against_numpy_for_the_same_draws(mode, alphas):
    settings = mixing.MixSettings(mixup_alpha=alphas[0], cutmix_alpha=alphas[1], mode=mode)
    rng = np.random.default_rng(0)
    images = rng.normal(size=(6, 12, 10, 3)).astype(np.float32)
    labels = np.arange(6, dtype=np.int32)
    batch = {"image": tf.constant(images), "label": tf.constant(labels)}
    for seed in range(5):
        choices = mixing.draws(tf.constant([seed, 9], tf.int64), settings, 6)
        ours = mixing.mix_with(batch, choices)
        expected = numpy_mix(
            images, labels, *(choices[k].numpy() for k in ("cutmix", "lam", "centre"))
        )
        np.testing.assert_allclose(ours["image"].numpy(), expected[0], rtol=1e-6, atol=1e-6)
        np.testing.assert_array_equal(ours["label"].numpy(), expected[1])
        np.testing.assert_array_equal(ours["mix_label"].numpy(), expected[2])
        np.testing.assert_allclose(ours["mix_weight"].numpy(), expected[3], rtol=1e-6)
        if mode == "batch":
            assert len(set(choices["lam"].numpy().tolist())) == 1


def test_draws_follow_beta_and_the_switch_probability():
    settings = mixing.MixSettings(
        mixup_alpha=0.4, cutmix_alpha=1.0, switch_prob=0.3, mode="example"
    )
    choices = mixing.draws(tf.constant([1, 2], tf.int64), settings, 20_000)
    cutmix, lam = choices["cutmix"].numpy(), choices["lam"].numpy()
    n = len(lam)
    assert abs(cutmix.mean() - 0.3) < 4 * np.sqrt(0.3 * 0.7 / n)
    for alpha, chosen in ((1.0, lam[cutmix]), (0.4, lam[~cutmix])):
        # Beta(a, a): mean 1/2, variance 1 / (4 (2a + 1)).
        variance = 1 / (4 * (2 * alpha + 1))
        assert abs(chosen.mean() - 0.5) < 4 * np.sqrt(variance / len(chosen))
        assert chosen.var() == pytest.approx(variance, rel=0.1)
    again = mixing.draws(tf.constant([1, 2], tf.int64), settings, 20_000)
    np.testing.assert_array_equal(again["lam"].numpy(), lam)  # Stateless: the same seed.


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"mixup_alpha": -1}, "data.mix.mixup_alpha must be a number >= 0, got -1"),
        ({"switch_prob": 2}, "data.mix.switch_prob must be in \\[0, 1\\], got 2"),
        ({"mode": "pair"}, "data.mix.mode must be one of: batch, example, got 'pair'"),
    ],
)
def test_bad_settings_are_one_line(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        mixing.MixSettings(**kwargs)


def test_the_pipeline_mixes_each_batch_by_its_number_whatever_the_entry_point(tmp_path):
    from resnet_app.data import input_pipeline, seeds

    config = data_config(
        dataset="shapes",
        data_dir=str(tmp_path),
        train_examples=48,
        eval_examples=8,
        mixup_alpha=0.4,
        cutmix_alpha=1.0,
        mix_mode="example",
    )
    pipeline = input_pipeline.create_pipeline(config)
    plain = input_pipeline.create_pipeline(
        data_config(dataset="shapes", data_dir=str(tmp_path), train_examples=48)
    )
    stream = list(pipeline.train_dataset(12).take(3))
    entered = next(iter(pipeline.train_dataset(12, start_example=24)))
    for key, value in stream[2].items():
        np.testing.assert_array_equal(entered[key].numpy(), value.numpy())
    # Batch 1 is the unmixed batch 1, mixed by the draws of seed (MIX, batch 1).
    unmixed = list(plain.train_dataset(12).take(2))[1]
    key = seeds.stream_seed(0, seeds.MIX, 0)
    choices = mixing.draws(
        tf.random.experimental.stateless_fold_in(key, tf.constant(1, tf.int64)),
        config.mix,
        12,
    )
    expected = mixing.mix_with(unmixed, choices)
    for name in ("image", "label", "mix_label", "mix_weight"):
        np.testing.assert_array_equal(stream[1][name].numpy(), expected[name].numpy())
    assert not np.array_equal(stream[1]["image"].numpy(), unmixed["image"].numpy())
