"""Greyscale data is greyscale to the user: one input channel, in training, export and predict.

References: PIL's own `convert("L")` for the luma, NumPy reads of the IDX
bytes for the pixels and statistics, and the 3-channel run of the same grey
data for the augmentations and for RGB weights summed into a grey stem.
"""

import json
import logging
import re

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from resnet_app.common import run_dir
from resnet_app.common.errors import ConfigError
from resnet_app.data import channels
from resnet_app.data.input_pipeline import InputPipeline, Recorded
from resnet_app.data.run_pipeline import _recorded
from resnet_app.data.settings import DataConfig, data_config
from tests import own_data

rng = np.random.default_rng(11)
TRAIN = rng.integers(0, 256, (40, 12, 12), np.uint8)
TEST = rng.integers(0, 256, (9, 12, 12), np.uint8)
LABELS = {"train": np.arange(40) % 4, "test": np.arange(9) % 4}


@pytest.fixture(scope="module")
def idx_dir(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("idx") / "mnist")
    arrays = {
        ("train", "images"): TRAIN,
        ("train", "labels"): LABELS["train"].astype(np.uint8),
        ("test", "images"): TEST,
        ("test", "labels"): LABELS["test"].astype(np.uint8),
    }
    own_data.write_idx(root, arrays)
    return root


def idx_config(root, **fields):
    return data_config(dataset=f"idx:{root}", num_classes=4, **fields)


def eval_images(pipeline):
    batches = pipeline.eval_dataset(16).as_numpy_iterator()
    return np.concatenate([b["image"][b["mask"] > 0] for b in batches])


def test_luma_is_pil_s_and_grey_round_trips():
    rgb = rng.integers(0, 256, (7, 9, 3), np.uint8)
    pil = np.asarray(Image.fromarray(rgb).convert("L"))
    np.testing.assert_array_equal(channels.convert_array(rgb, 1)[..., 0], pil)
    grey = rng.integers(0, 256, (7, 9, 1), np.uint8)
    np.testing.assert_array_equal(channels.convert_array(channels.convert_array(grey, 3), 1), grey)
    rgba = np.concatenate([rgb, np.full((7, 9, 1), 9, np.uint8)], axis=-1)
    np.testing.assert_array_equal(channels.convert_array(rgba, 3), rgb)


@pytest.mark.parametrize("have", [1, 2, 3, 4])
@pytest.mark.parametrize("want", [1, 3])
def test_tensorflow_conversion_is_numpy_s_known_or_not(have, want):
    image = rng.integers(0, 256, (5, 6, have), np.uint8)
    expected = channels.convert_array(image, want)
    np.testing.assert_array_equal(channels.convert(image, want).numpy(), expected)
    unknown = tf.function(
        lambda x: channels.convert(x, want),
        input_signature=[tf.TensorSpec([None, None, None], tf.uint8)],
    )
    np.testing.assert_array_equal(unknown(image).numpy(), expected)


def test_idx_data_is_one_channel_normalized_by_its_own_statistics(idx_dir, caplog):
    with caplog.at_level(logging.INFO, logger="absl"):
        pipeline = InputPipeline(idx_config(idx_dir), 32, "resnet20")
    pixels = TRAIN.astype(np.float64)
    assert pipeline.channels == 1
    assert pipeline.preprocessing.mean == pytest.approx((pixels.mean(),), rel=1e-12)
    assert pipeline.preprocessing.std == pytest.approx((pixels.std(),), rel=1e-12)
    assert "greyscale, the data's" in caplog.text
    images = eval_images(pipeline)
    assert images.shape == (9, 12, 12, 1)
    expected = (TEST[..., None] - pixels.mean()) / pixels.std()
    np.testing.assert_allclose(images, expected, rtol=1e-6, atol=1e-6)


def test_three_channels_on_request_repeat_the_grey(idx_dir):
    pipeline = InputPipeline(idx_config(idx_dir, channels=3), 32, "resnet20")
    assert pipeline.channels == 3
    assert pipeline.preprocessing.mean == pytest.approx((TRAIN.mean(),) * 3, rel=1e-12)
    images = eval_images(pipeline)
    assert images.shape == (9, 12, 12, 3)
    np.testing.assert_array_equal(images[..., 1], images[..., 0])
    np.testing.assert_array_equal(images[..., 2], images[..., 0])


AUGMENT = {
    "augment": {"randaugment_ops": 2, "randaugment_magnitude": 9, "cutout_size": 4},
    "seed": 3,
}


def test_augmented_grey_images_are_the_rgb_run_s_first_channel(idx_dir):
    """RandAugment, crop, flip and Cutout on one channel do what they do on the grey in three."""
    grey = InputPipeline(idx_config(idx_dir, **AUGMENT), 32, "resnet20")
    rgb = InputPipeline(idx_config(idx_dir, channels=3, **AUGMENT), 32, "resnet20")
    one = next(iter(grey.train_dataset(16, start_example=8)))
    three = next(iter(rgb.train_dataset(16, start_example=8)))
    assert one["image"].shape == (16, 12, 12, 1)
    np.testing.assert_array_equal(one["id"], three["id"])
    np.testing.assert_allclose(one["image"][..., 0], three["image"][..., 0], rtol=1e-6)
    np.testing.assert_allclose(three["image"][..., 2], three["image"][..., 0], rtol=1e-6)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """Grey PNGs; RGB PNGs; grey PNGs with one RGB file among them."""
    root = tmp_path_factory.mktemp("folders")
    colour = rng.integers(0, 256, (6, 10, 10, 3), np.uint8)
    for name, images in (("grey", TRAIN[:6, :10, :10, None]), ("rgb", colour)):
        for split in ("train", "test"):
            own_data.write_pngs(str(root / name / split / "a"), images[:3], split)
            own_data.write_pngs(str(root / name / split / "b"), images[3:], split)
    mixed = root / "mixed"
    for split in ("train", "test"):
        own_data.write_pngs(str(mixed / split / "a"), TRAIN[:3, :10, :10, None], split)
        own_data.write_pngs(str(mixed / split / "b"), colour[3:4], split)
    return root, colour


def folder_pipeline(root, **fields):
    config = DataConfig(dataset=f"folder:{root}", dtype="float32", num_classes=2, **fields)
    return InputPipeline(config, 32, "resnet20")


def test_a_folder_of_grey_files_is_measured_greyscale(folders):
    root, _ = folders
    assert folder_pipeline(root / "grey").channels == 1
    assert folder_pipeline(root / "rgb").channels == 3
    assert folder_pipeline(root / "mixed").channels == 3  # One colour image among them.


def test_rgb_files_asked_for_in_one_channel_are_pil_s_luma(folders):
    root, colour = folders
    pipeline = folder_pipeline(root / "rgb", channels=1)
    luma = np.stack([np.asarray(Image.fromarray(image).convert("L")) for image in colour])
    mean, std = luma.astype(np.float64).mean(), luma.astype(np.float64).std()
    assert pipeline.preprocessing.mean == pytest.approx((mean,), rel=1e-12)
    assert pipeline.preprocessing.std == pytest.approx((std,), rel=1e-12)
    images = eval_images(pipeline)  # The test files: a/test0-2 (colour 0-2), b/test0-2 (3-5).
    expected = (luma[..., None] - mean) / std
    np.testing.assert_allclose(images, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "fields, message",
    [
        (
            {"channels": 2},
            "data.channels must be 1 (greyscale), 3 (RGB) or unset (the data's)",
        ),
        ({"mean": (1.0, 2.0)}, "mean has 2 values; give one per channel: 1 or 3"),
        ({"channels": 1, "std": (1.0, 2.0, 3.0)}, "std has 3 values; give one per channel: 1"),
        ({"mean": (1.0,), "std": (1.0, 2.0, 3.0)}, "mean has 1 values and std 3"),
    ],
)
def test_wrong_channel_settings_are_one_line(fields, message):
    with pytest.raises(ConfigError, match=re.escape(message)) as raised:
        data_config(**fields)
    assert "\n" not in str(raised.value)


def test_a_recorded_rgb_run_stays_rgb_on_resume(idx_dir, tmp_path):
    """Runs recorded before greyscale inputs (or in RGB) resume in RGB."""
    preprocessing = {"image_size": 12, "mean": [5.0, 5.0, 5.0], "std": [2.0, 2.0, 2.0]}
    info = {"dataset": f"idx:{idx_dir}", "class_names": list("abcd"), "multi_label": False}
    run_dir.write_data_info(str(tmp_path), {**info, "preprocessing": preprocessing})
    recorded = _recorded(str(tmp_path), f"idx:{idx_dir}", 32)
    assert recorded.trained_channels == 3
    pipeline = InputPipeline(idx_config(idx_dir), 32, "resnet20", recorded)
    assert pipeline.channels == 3 and pipeline.preprocessing.mean == (5.0, 5.0, 5.0)
    old = {"image_size": 12}  # Before the statistics were recorded.
    run_dir.write_data_info(str(tmp_path), {**info, "preprocessing": old})
    assert _recorded(str(tmp_path), f"idx:{idx_dir}", 32).trained_channels == 3
    grey = Recorded(12, ((5.0,), (2.0,)), 1)
    assert InputPipeline(idx_config(idx_dir), 32, "resnet20", grey).channels == 1


def test_rgb_weights_summed_into_a_grey_stem_see_the_grey_image_as_rgb():
    """timm's rule: the RGB network on grey-in-three equals the grey network with summed kernels."""
    from resnet_app.nets import parts
    from resnet_app.nets.resnet import create_model
    from resnet_app.pretrained import weights

    def built(channels_in):
        model = create_model("tiny", num_classes=3)
        model.build((None, 16, 16, channels_in))
        return model

    rgb, grey = built(3), built(1)
    source = weights.SourceWeights(layers=parts.get_weights(rgb), skipped={})
    weights.assign(grey, source, "the RGB model", "tiny")
    images = rng.normal(size=(4, 16, 16, 1)).astype(np.float32)
    expected = rgb(np.repeat(images, 3, axis=-1), training=False).numpy()
    got = grey(images, training=False).numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
    back = built(3)  # And a grey network's weights into an RGB stem: repeated, / 3.
    weights.assign(back, weights.SourceWeights(parts.get_weights(grey), {}), "grey", "tiny")
    np.testing.assert_allclose(back(np.repeat(images, 3, axis=-1), training=False), got, atol=1e-5)


def test_a_grey_run_trains_exports_and_predicts_in_one_channel(idx_dir, tmp_path):
    from resnet_app import config
    from resnet_app.engine import loop
    from resnet_app.nets import factory
    from tests.commands import run_command

    resolved = config.resolve(
        sets=[
            "model.name=tiny",
            f"data.dataset=idx:{idx_dir}",
            "data.num_classes=4",
            "train.batch_size=8",
        ],
        overrides={"train": {"train_steps": 2, "eval_every": 2}},
    )
    model_dir = tmp_path / "run"
    loop.train_and_evaluate(resolved, str(model_dir))
    info = run_dir.read_data_info(str(model_dir), lambda info: info)
    assert len(info["preprocessing"]["mean"]) == 1
    export = tmp_path / "export"
    result = run_command(
        "resnet_app.export", f"--model_dir={model_dir}", f"--export_dir={export}", "--format=tflite"
    )
    assert result.returncode == 0, result.stderr
    portable = json.loads(result.stdout)["formats"][1]
    assert portable["format"] == "tflite_none" and portable["agreement"] == 1.0
    with open(export / "model_info.json") as file:
        assert json.load(file)["channels"] == 1
    served = tf.saved_model.load(str(export)).signatures["serving_default"]
    grey = TEST[:4, :, :, None]
    one = served(images=tf.constant(grey))["probabilities"].numpy()
    three = served(images=tf.constant(np.repeat(grey, 3, axis=-1)))["probabilities"].numpy()
    np.testing.assert_allclose(three, one, rtol=1e-6)
    # The in-process model on the same images, normalized by the recorded statistics.
    mean, std = info["preprocessing"]["mean"][0], info["preprocessing"]["std"][0]
    model = factory.create_run_model(resolved, 4, 12, channels=1)
    tf.train.Checkpoint(model=model).restore(str(model_dir / "ckpt-2")).expect_partial()
    logits = model(((grey - mean) / std).astype(np.float32), training=False).numpy()
    expected = np.exp(logits - logits.max(1, keepdims=True))
    np.testing.assert_allclose(one, expected / expected.sum(1, keepdims=True), rtol=1e-5)
    png = tmp_path / "grey.png"
    png.write_bytes(tf.io.encode_png(grey[0]).numpy())
    result = run_command("resnet_app.predict", f"--export_dir={export}", "--json", str(png))
    assert result.returncode == 0, result.stderr
    record = json.loads(result.stdout.splitlines()[0])
    assert record["top_k"][0]["probability"] == pytest.approx(one[0].max(), rel=1e-5)


def test_rgb_weights_statistics_for_grey_inputs_are_their_luma_weighted_means():
    from resnet_app import config
    from resnet_app.pretrained import sources as pretrained

    source = pretrained.Source(
        "torchvision:x", pretrained.TORCHVISION, "x", None, {}, (100.0, 50.0, 20.0), (4.0, 2.0, 1.0)
    )
    grey = pretrained.adopt(config.resolve(sets=["data.channels=1"]), source).data
    assert grey.mean == pytest.approx((0.299 * 100 + 0.587 * 50 + 0.114 * 20,), abs=1e-3)
    assert grey.std == pytest.approx((0.299 * 4 + 0.587 * 2 + 0.114 * 1,), abs=1e-4)
    rgb = pretrained.adopt(config.resolve(), source).data  # Unset: the weights' channels.
    assert (rgb.mean, rgb.std, rgb.channels) == (source.mean, source.std, None)
