"""AugMix and its Jensen-Shannon consistency loss.

References: torchvision's `AugMix._augmentation_space(10, size)` (its tables,
written here from its definition with torch's float32 linspace), each op as
torchvision's `_apply_op` computes it on a PIL image (`tests/test_trivialaugment.py`
writes that path; AugMix samples BILINEARly), the mix as torchvision's float32
sum truncated to uint8 (in NumPy), the draws' distributions (Beta, Dirichlet,
uniform) by their moments, and the loss as the paper's code writes it (in
NumPy: KL of each prediction to the clipped mixture, `F.kl_div`'s batchmean).

Tolerances. Pointwise, histogram and blend ops and the mix of their chains
are exact. The geometric ops follow test_randaugment's bilinear rule: equal
where every sampled neighbour is inside and the exact value is not within
2e-3 of an integer, else at most 1 apart; along the edge PIL repeats the edge
pixel where we blend with the fill.
"""

import math

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from resnet_app import config
from resnet_app.common.errors import ConfigError
from resnet_app.data import augment_ops, augmix, preprocessing
from resnet_app.data import randaugment as ra
from resnet_app.data.settings import data_config
from resnet_app.engine.losses import Loss, consistency
from resnet_app.engine.losses.consistency import Consistency
from resnet_app.engine.losses.cross_entropy import CrossEntropy
from resnet_app.engine.step import Tower
from resnet_app.nets import drop_path
from tests import runs
from tests.small_models import SIZE, initial_weights, no_bn
from tests.test_randaugment import (
    CIFAR,
    FILL,
    assert_per_example_and_enterable,
    bilinear_exact,
    over_seeds,
    sample_images,
    shapes_pipeline,
    with_augment,
)
from tests.test_trivialaugment import linspace32, tv_apply_op, tv_matrix

pytestmark = pytest.mark.usefixtures("private_shapes_cache")

GEOMETRIC = ("Rotate", "ShearX", "ShearY", "TranslateX", "TranslateY")
SIGNED = (*GEOMETRIC, *augmix.ENHANCE_OPS)
AUGMIX = {"auto_augment": "augmix"}
JSD = {"auto_augment": "augmix", "augmix_jsd": 12.0}


def tv_magnitude(name, index, width, height):
    """torchvision's `AugMix._augmentation_space(10, (height, width))` at bin `index`."""
    if name in ("ShearX", "ShearY"):
        return linspace32(0.0, 0.3, index, steps=10)
    if name == "TranslateX":
        return linspace32(0.0, width / 3.0, index, steps=10)
    if name == "TranslateY":
        return linspace32(0.0, height / 3.0, index, steps=10)
    if name == "Rotate":
        return linspace32(0.0, 30.0, index, steps=10)
    if name == "Posterize":
        return int(4 - round(index / 2.25))  # torch: (arange / 2.25).round(): never a half.
    if name == "Solarize":
        return linspace32(255.0, 0.0, index, steps=10)
    if name in augmix.ENHANCE_OPS:
        return linspace32(0.0, 0.9, index, steps=10)
    return 0.0


def reference_op(name, image, index, sign):
    """AugMix's op `name` at bin `index` and `sign`, torchvision's way (BILINEAR)."""
    height, width = image.shape[:2]
    magnitude = tv_magnitude(name, index, width, height) * (sign if name in SIGNED else 1)
    if name == "Posterize" and magnitude == 0:
        # Bins 8 and 9 keep no bit: black (PIL before 11 masks with ~255; torchvision's
        # tensor op with -256); PIL 11 refuses 0 bits.
        return np.zeros_like(image)
    return tv_apply_op(name, image, magnitude, resample=Image.BILINEAR)


def apply(name, image, index, sign):
    """Our op at bin `index` on one image (a batch of one), AugMix's ranges."""
    signs, bins = tf.constant([float(sign)]), tf.constant([float(index)])
    images = tf.constant(image)[None]
    return augment_ops.apply_op(name, images, signs, bins, FILL, augmix.RANGES)[0].numpy()


# -- the ranges and the ops ------------------------------------------------------------


def test_the_tables_are_torchvisions_augmix_bins():
    k = np.arange(10)
    tables = augmix.TABLES
    assert tables["bits"].tolist() == [4, 4, 3, 3, 2, 2, 1, 1, 0, 0]
    assert tables["degrees"].tolist() == [linspace32(0.0, 30.0, i, 10) for i in k]
    assert tables["shear"].tolist() == [linspace32(0.0, 0.3, i, 10) for i in k]
    assert tables["factor"].tolist() == [linspace32(0.0, 0.9, i, 10) for i in k]
    assert tables["threshold"].tolist() == [math.ceil(linspace32(255.0, 0.0, i, 10)) for i in k]
    for size in (28, 32, 40, 224, 331):
        pixels = augmix.translation(tf.constant(k, tf.float32), float(size)).numpy()
        assert pixels.tolist() == [int(linspace32(0.0, size / 3.0, i, 10)) for i in k], size
    # The op set: the paper's nine, and torchvision's all_ops adds the four enhance ops.
    assert augmix.op_count(False) == 9 and augmix.op_count(True) == 13
    assert set(augmix.OPS) <= set(ra.OPS) and augmix.OPS[0] == "Identity"


@pytest.mark.parametrize("name", [op for op in augmix.OPS[1:] if op not in GEOMETRIC])
def test_pointwise_histogram_and_blend_ops_equal_torchvision(name):
    for image in sample_images():
        for index in range(10):
            for sign in (-1, 1):
                np.testing.assert_array_equal(
                    apply(name, image, index, sign),
                    reference_op(name, image, index, sign),
                    err_msg=f"{name} bin={index} sign={sign}",
                )


@pytest.mark.parametrize("name", GEOMETRIC)
def test_geometric_ops_equal_torchvision_bilinear_inside_the_image(name):
    compared = total = 0
    for image in sample_images():
        height, width = image.shape[:2]
        for index in (1, 2, 5, 9):
            for sign in (-1, 1):
                got = apply(name, image, index, sign).astype(int)
                want = reference_op(name, image, index, sign).astype(int)
                magnitude = tv_magnitude(name, index, width, height) * sign
                a, b, c, d, e, f = tv_matrix(name, magnitude, width, height)
                y, x = np.mgrid[0:height, 0:width] + 0.5
                u, v = a * x + b * y + c - 0.5, d * x + e * y + f - 0.5  # integer centres
                inside = (u >= -1e-6) & (u <= width - 1 + 1e-6)
                inside &= (v >= -1e-6) & (v <= height - 1 + 1e-6)
                exact, certain = bilinear_exact(
                    image, np.clip(u, 0, width - 1), np.clip(v, 0, height - 1)
                )
                ambiguous = (np.abs(exact - np.round(exact)) < 2e-3) & ~certain
                sure = inside[..., None] & ~ambiguous
                message = f"{name} bin={index} sign={sign}"
                np.testing.assert_array_equal(got[sure], want[sure], err_msg=message)
                assert np.abs(got - want)[inside].max(initial=0) <= 1, message
                compared += sure.sum()
                total += got.size
    assert compared > 0.4 * total  # Not vacuous.


# -- the draws and the mix ----------------------------------------------------------------


def draws_of(count, views=1, **settings):
    augment = data_config(augment={**AUGMIX, **settings}).augment
    example_seeds = [(i, 5) for i in range(count)]
    return over_seeds(lambda seed: augmix.choose(seed, augment, views), example_seeds)


def test_the_draws_follow_the_papers_distributions():
    count = 3000
    drawn = draws_of(count)
    weights = drawn["augmix_weights"][:, 0]  # [count, 4]: m0, then w_i * m1.
    np.testing.assert_allclose(weights.sum(axis=1), 1.0, rtol=1e-5)
    # m0 ~ Beta(1, 1): uniform, mean 1/2 and variance 1/12.
    assert abs(weights[:, 0].mean() - 0.5) < 5 * math.sqrt(1 / 12 / count)
    assert abs(weights[:, 0].var() - 1 / 12) < 0.01
    # Each chain's share of the rest is Dirichlet(1, 1, 1): a third of it on average.
    shares = weights[:, 1:] / weights[:, 1:].sum(axis=1, keepdims=True)
    np.testing.assert_allclose(shares.mean(axis=0), 1 / 3, atol=5 * math.sqrt(1 / 18 / count))
    ops = drawn["augmix_ops"][:, 0]  # [count, 3 chains, 3]
    depths = (ops > 0).sum(axis=-1).ravel()
    assert (ops[..., 0] > 0).all()  # Every chain has an op; the rest pad with the Identity.
    assert all(((ops[..., i] > 0) >= (ops[..., i + 1] > 0)).all() for i in range(2))
    for depth in (1, 2, 3):  # Uniform on 1 to 3.
        assert abs(np.mean(depths == depth) - 1 / 3) < 5 * math.sqrt(2 / 9 / depths.size)
    used = ops[ops > 0]
    counts = np.bincount(used, minlength=len(augmix.OPS))[1:]
    expected = used.size / 13
    assert np.all(np.abs(counts - expected) < 5 * math.sqrt(expected)), counts
    bins = drawn["augmix_bins"][:, 0][ops > 0]
    assert set(np.unique(bins).tolist()) == {0.0, 1.0, 2.0}  # The first `severity` = 3 bins.
    signs = drawn["augmix_signs"][:, 0]
    assert set(np.unique(signs).tolist()) == {-1.0, 1.0}


def test_the_settings_change_the_draws_as_they_say():
    fixed = draws_of(200, augmix_depth=2, augmix_width=4, augmix_severity=7, augmix_all_ops=False)
    assert fixed["augmix_ops"].shape == (200, 1, 4, 2) and (fixed["augmix_ops"] > 0).all()
    assert fixed["augmix_ops"].max() == augmix.op_count(False)  # No enhance op.
    assert fixed["augmix_bins"].max() == 6 and fixed["augmix_weights"].shape == (200, 1, 5)
    # alpha: m0 ~ Beta(alpha, alpha), whose variance is 1 / (4 (2 alpha + 1)).
    for alpha in (0.1, 10.0):
        m0 = draws_of(400, augmix_alpha=alpha)["augmix_weights"][:, 0, 0]
        assert abs(m0.var() - 1 / (4 * (2 * alpha + 1))) < 0.02, alpha
    # Stateless: the same seed draws the same; a plain run's AugMix is the first view's.
    again, two = draws_of(20), draws_of(20, views=2, augmix_jsd=12)
    for key in augmix.FEATURES:
        np.testing.assert_array_equal(again[key], draws_of(20)[key])
        np.testing.assert_array_equal(two[key][:, 0], again[key][:, 0])
        assert not np.array_equal(two[key][:, 0], two[key][:, 1]), key


def reference_mix(image, ops, signs, bins, weights):
    """torchvision's AugMix of one image from these draws: the chains by its PIL ops, the
    weighted sum in float32 in its order, truncated to uint8."""
    mixed = np.float32(weights[0]) * image.astype(np.float32)
    for chain in range(ops.shape[0]):
        augmented = image
        for op, sign, index in zip(ops[chain], signs[chain], bins[chain]):
            if op:
                augmented = reference_op(augmix.OPS[op], augmented, int(index), sign)
        mixed += np.float32(weights[chain + 1]) * augmented.astype(np.float32)
    return mixed.astype(np.uint8)


def test_a_batch_mixes_each_image_by_its_own_chains_as_torchvision():
    images = np.stack(sample_images() * 4)  # 12 images.
    drawn = {key: value[:, 0] for key, value in draws_of(12).items()}
    # The chains without geometric ops, whose PIL arithmetic we reproduce exactly.
    geometric = np.isin(np.array(augmix.OPS)[drawn["augmix_ops"]], GEOMETRIC)
    drawn["augmix_ops"] = np.where(geometric, augmix.OPS.index("Equalize"), drawn["augmix_ops"])
    tensors = [tf.constant(drawn[key]) for key in augmix.FEATURES]
    got = augmix.mix(tf.constant(images), *tensors, FILL).numpy()
    for i, image in enumerate(images):
        expected = reference_mix(image, *(drawn[key][i] for key in augmix.FEATURES))
        np.testing.assert_array_equal(got[i], expected, err_msg=f"image {i}")
    assert np.mean(got != images) > 0.5


def test_greyscale_images_mix_as_their_rgb_copies_do():
    grey = np.stack([image[..., :1] for image in sample_images()])
    drawn = {key: tf.constant(value) for key, value in draws_of(3).items()}
    config = with_augment(CIFAR, auto_augment="augmix", mean=(120.0,), std=(60.0,))
    got = preprocessing._on_pixels(augmix.AugMix(), tf.constant(grey), drawn, config).numpy()
    rgb = np.repeat(grey, 3, axis=-1)
    want = augmix.mix(tf.constant(rgb), *(drawn[k][:, 0] for k in augmix.FEATURES), (120,) * 3)
    np.testing.assert_array_equal(got, want.numpy()[..., :1])
    assert config.channels == 1


# -- the pipeline ---------------------------------------------------------------------


def test_the_pipeline_augments_each_example_by_its_draws_and_enters_anywhere():
    assert_per_example_and_enterable(AUGMIX)


def test_with_the_consistency_loss_a_batch_holds_the_plain_image_and_two_augmixes():
    """The image is the recipe without AugMix; the first view is what a plain AugMix run
    trains on; the second is drawn apart; all three cropped and flipped alike."""
    batches = {
        name: next(iter(shapes_pipeline(augment=augment).train_dataset(16)))
        for name, augment in (("jsd", JSD), ("augmix", AUGMIX), ("plain", {}))
    }
    jsd = batches["jsd"]
    assert jsd["augmix_views"].shape == (16, 2, 32, 32, 3)
    np.testing.assert_array_equal(jsd["id"], batches["plain"]["id"])
    np.testing.assert_array_equal(jsd["image"], batches["plain"]["image"])
    np.testing.assert_array_equal(jsd["augmix_views"][:, 0], batches["augmix"]["image"])
    assert np.mean(jsd["augmix_views"][:, 1] != jsd["augmix_views"][:, 0]) > 0.5
    # ImageNet's per-example recipe gives its three views alike.
    config = with_augment(CIFAR, family="imagenet", **JSD)
    image = tf.constant(sample_images()[0])
    views = preprocessing.imagenet_train(image, tf.constant([3, 4], tf.int64), config).numpy()
    plain = with_augment(CIFAR, family="imagenet")
    single = with_augment(CIFAR, family="imagenet", **AUGMIX)
    for index, expected in ((0, plain), (1, single)):
        np.testing.assert_array_equal(
            views[index],
            preprocessing.imagenet_train(image, tf.constant([3, 4], tf.int64), expected),
        )


# -- the loss ---------------------------------------------------------------------------


def numpy_js(logits, first, second):
    """The paper's code in NumPy: batchmean KL of each prediction to the clipped mixture."""
    probs = []
    for x in (logits, first, second):
        x = x.astype(np.float64) - x.max(-1, keepdims=True)
        probs.append(np.exp(x) / np.exp(x).sum(-1, keepdims=True))
    log_mixture = np.log(np.clip(sum(probs) / 3, 1e-7, 1))
    return sum((p * (np.log(p) - log_mixture)).sum(-1) for p in probs) / 3


def test_the_loss_is_the_usual_loss_plus_lambda_times_the_papers_js():
    from tests.test_losses import numpy_cross_entropy

    rng = np.random.default_rng(0)
    logits, first, second = (rng.normal(size=(6, 5)).astype(np.float32) * 3 for _ in range(3))
    labels = rng.integers(0, 5, 6).astype(np.int32)
    mask = np.array([1, 1, 1, 1, 1, 0], np.float32)  # A padded example counts nothing.
    batch = {
        "label": tf.constant(labels),
        "mask": tf.constant(mask),
        consistency.LOGITS_KEY: tf.constant(np.stack([first, second])),
    }
    js = numpy_js(logits, first, second)
    np.testing.assert_allclose(Consistency().term(logits, batch), js, rtol=1e-5, atol=1e-7)
    for smoothing in (0.0, 0.1):
        sums = Loss((CrossEntropy(smoothing), Consistency(12.0)))(tf.constant(logits), batch)
        total, correct = sums["loss"], sums["correct"]
        targets = np.eye(5)[labels] * (1 - smoothing) + smoothing / 5
        expected = (mask * (numpy_cross_entropy(logits, targets) + 12.0 * js)).sum()
        np.testing.assert_allclose(total.numpy(), expected, rtol=1e-5)
        assert correct.numpy() == (mask * (logits.argmax(-1) == labels)).sum()
    # Identical predictions diverge by nothing.
    same = {consistency.LOGITS_KEY: tf.constant(np.stack([logits, logits]))}
    np.testing.assert_allclose(Consistency().term(logits, same), 0.0, atol=1e-6)


def test_a_tower_runs_the_three_views_as_one_batch_and_its_gradient_is_the_losss():
    """Against the model called on each view apart, the loss written out with TF's
    plain ops (log of the softmax, KL to the clipped mixture)."""
    model = no_bn()
    model.build((None, SIZE, SIZE, 3))
    model.set_weights(initial_weights(no_bn))
    rng = np.random.default_rng(2)
    images = rng.normal(size=(3, 4, SIZE, SIZE, 3)).astype(np.float32)
    batch = {
        "image": tf.constant(images[0]),
        "augmix_views": tf.constant(images[1:].transpose(1, 0, 2, 3, 4)),
        "label": tf.constant([0, 1, 2, 3], tf.int32),
        "mask": tf.constant([1.0, 1.0, 1.0, 0.0]),
        "id": tf.constant([4, 5, 6, 7], tf.int64),
    }
    import keras

    tower = Tower(model, keras.optimizers.SGD(0.1), Loss((CrossEntropy(), Consistency(12.0))))
    gradients, sums = tower(batch, tf.constant(3.0), 1)
    loss_sum = sums["loss"]
    with tf.GradientTape() as tape:
        probs = [tf.nn.softmax(model(tf.constant(view), training=True)) for view in images]
        log_mixture = tf.math.log(tf.clip_by_value(tf.add_n(probs) / 3, 1e-7, 1.0))
        js = tf.add_n([tf.reduce_sum(p * (tf.math.log(p) - log_mixture), -1) for p in probs]) / 3
        ce = -tf.math.log(tf.gather(probs[0], batch["label"], batch_dims=1))
        expected_sum = tf.reduce_sum(batch["mask"] * (ce + 12.0 * js))
        loss = expected_sum / 3.0 + tf.add_n(model.losses)
    expected = tape.gradient(loss, model.trainable_variables)
    np.testing.assert_allclose(loss_sum.numpy(), expected_sum.numpy(), rtol=1e-5)
    for got, want in zip(gradients, expected, strict=True):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-4, atol=1e-6)


def test_each_view_draws_its_own_stochastic_depth():
    ids = tf.constant([3, 9], tf.int64)
    batch = {"image": tf.zeros([2, 4, 4, 3]), "id": ids, "augmix_views": tf.zeros([2, 2, 4, 4, 3])}
    stacked_ids, copies = consistency.stacked_keys(batch)
    assert consistency.stacked_images(batch).shape[0] == 6
    assert stacked_ids.numpy().tolist() == [3, 9] * 3
    assert copies.numpy().tolist() == [0, 0, 1, 1, 2, 2]
    repeated = {**batch, "copy": tf.constant([0, 2], tf.int64)}
    assert consistency.stacked_keys(repeated)[1].numpy().tolist() == [0, 6, 1, 7, 2, 8]
    plain = {"image": batch["image"], "id": ids}
    assert consistency.stacked_keys(plain)[1] is None  # The keys of a run without views.
    # Copy 0's first view keys as a run without views; the others apart.
    keys = drop_path.example_keys(0, 5, stacked_ids, copies).numpy()
    np.testing.assert_array_equal(keys[:2], drop_path.example_keys(0, 5, ids).numpy())
    assert len(set(keys.tolist())) == 6


# -- whole runs and the settings ------------------------------------------------------------


def test_a_kill_mid_epoch_resumes_bitwise_with_augmix_views(tmp_path):
    from tests.test_checkpoint import SMALL, drive

    args = [*SMALL, f"--data_dir={tmp_path / 'data'}", "--train_steps=10", "--deterministic"]
    args += ["--set=train.checkpoint_every=3", "--set=data.augment.auto_augment=augmix"]
    args += ["--set=data.augment.augmix_jsd=12", "--set=model.drop_path_rate=0.2"]
    whole = drive(*args, f"--model_dir={tmp_path / 'whole'}")
    assert whole.returncode == 0, whole.stderr[-3000:]
    kill_at = runs.fault_rng().randint(4, 5)
    killed = drive(*args, f"--model_dir={tmp_path / 'run'}", kill_at=kill_at)
    assert killed.returncode == -9, killed.stderr[-3000:]
    resumed = drive(*args, f"--model_dir={tmp_path / 'run'}")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "Resumed from step 3" in resumed.stderr
    runs.assert_same_checkpoints(
        tmp_path / "whole" / "ckpt-10", tmp_path / "run" / "ckpt-10", f"(killed at {kill_at})"
    )


def test_batch_norm_measured_again_sees_every_view_the_step_trained_on():
    """An average's BatchNorm statistics (SWA, `resnet-app average`) come from the
    batches' images and views, as one batch of 3B: those of the stacked images."""
    from resnet_app.evaluation import soup
    from tests.small_models import tiny_bn

    rng = np.random.default_rng(3)
    images = rng.normal(size=(3, 4, SIZE, SIZE, 3)).astype(np.float32)
    with_views = {
        "image": tf.constant(images[0]),
        "augmix_views": tf.constant(images[1:].transpose(1, 0, 2, 3, 4)),
        "id": tf.range(4, dtype=tf.int64),
    }
    stacked = {"image": tf.constant(images.reshape(-1, SIZE, SIZE, 3)), "id": tf.range(12)}
    statistics = []
    for batch in (with_views, stacked):
        model = tiny_bn(synchronized=False)
        model.build((None, SIZE, SIZE, 3))
        model.set_weights(initial_weights(lambda: tiny_bn(synchronized=False)))
        assert soup.recompute_batch_norm(model, [batch]) == 1
        statistics.append([v.numpy() for v in model.non_trainable_variables])
    for got, want in zip(*statistics, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_synthetic_data_carries_views_so_the_step_costs_what_it_will():
    from resnet_app.data import input_pipeline

    pipeline = input_pipeline.create_pipeline(data_config(dataset="synthetic", augment=JSD))
    batch = next(iter(pipeline.train_dataset(8)))
    assert batch["augmix_views"].shape == (8, 2, *batch["image"].shape[1:])


def test_show_batch_puts_each_examples_three_views_in_a_row(tmp_path):
    from tests.test_data_cli import show_batch

    out = tmp_path / "b.png"
    args = ["--dataset=shapes", f"--data_dir={tmp_path}", "--train_examples=64", "--count=4"]
    result = show_batch(*args, "--auto_augment=augmix", "--augmix_jsd=12", f"--out={out}")
    assert result.returncode == 0, result.stderr
    assert f"Wrote 12 images to {out}" in result.stderr


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (["data.augment.augmix_width=2"], "data.augment.augmix_width is AugMix's and "),
        (["data.augment.auto_augment=augmix", "data.augment.augmix_severity=11"], "1 to 10"),
        (["data.augment.auto_augment=augmix", "data.augment.augmix_depth=0"], "-1 (each chain"),
        (["data.augment.auto_augment=augmix", "data.augment.augmix_alpha=0"], "augmix_alpha"),
        (
            [
                "data.augment.auto_augment=augmix",
                "data.augment.augmix_jsd=12",
                "data.mix.mixup_alpha=0.2",
            ],
            "compares an example's views and data.mix blends examples",
        ),
        (
            ["data.augment.auto_augment=augmix", "data.augment.augmix_jsd=12", "train.teacher=x"],
            "and train.teacher are two extra losses",
        ),
    ],
)
def test_bad_augmix_settings_are_one_line(sets, message):
    with pytest.raises(ConfigError, match=None) as error:
        config.resolve(sets=sets)
    assert message in str(error.value), str(error.value)
    assert "\n" not in str(error.value)


def test_data_settings_alone_refuse_the_consistency_loss_with_mixing():
    """show-batch and the benchmarks build only the data settings: refused there too."""
    with pytest.raises(ConfigError, match="compares an example's views and data.mix blends"):
        data_config(augment=JSD, mix={"cutmix_alpha": 1.0})


def test_multi_label_data_refuses_the_consistency_loss():
    from resnet_app.data import class_balance

    resolved = config.resolve(
        sets=["data.augment.auto_augment=augmix", "data.augment.augmix_jsd=12"]
    )
    with pytest.raises(ConfigError, match="data.augment.augmix_jsd needs one class per image"):
        class_balance.check_single_label_options(resolved, multi_label=True)
    class_balance.check_single_label_options(resolved, multi_label=False)
