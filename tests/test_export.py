"""`python -m resnet_app.export`: the SavedModel against the in-process model and NumPy.

The exported model is loaded in a process that cannot import resnet_app, and
its outputs are compared with the evaluation logits of the model restored in
this process, on the same images.
"""

import dataclasses
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from resnet_app.common import run_dir
from resnet_app.common.errors import ConfigError
from resnet_app.data import input_pipeline, run_pipeline
from resnet_app.data.settings import data_config
from resnet_app.engine import loop
from resnet_app.export import savedmodel
from resnet_app.nets import factory
from resnet_app.nets.resnet import create_model
from tests import runs
from tests.commands import blocked_packages, error_line, run_command
from tests.image_files import few_colour_image

# Loads the export with TensorFlow alone, with a resnet_app first on the path
# that raises when imported (the package itself may be installed here).
LOAD_SCRIPT = """
import json, sys
import numpy as np
import tensorflow as tf

try:
    import resnet_app
    raise AssertionError("resnet_app is importable")
except ImportError:
    pass
export_dir, inputs, output = sys.argv[1:]
arrays = np.load(inputs)
with open(arrays["png_list"].item()) as f:
    pngs = [open(path, "rb").read() for path in json.load(f)]
model = tf.saved_model.load(export_dir)
calls = {
    "default": ("serving_default", tf.constant(arrays["images"])),
    "bytes": ("serving_bytes", tf.constant(pngs)),
    "features": ("features", tf.constant(arrays["images"])),
    "larger": ("serving_default", tf.constant(arrays["larger"])),
}
results = {}
for call, (signature, images) in calls.items():
    for key, value in model.signatures[signature](images=images).items():
        value = value.numpy()
        results[f"{call}/{key}"] = value.astype(str) if value.dtype == object else value
assert not [name for name in sys.modules if name.startswith("resnet_app")]
np.savez(output, **results)
"""


def export_cli(*args):
    return run_command("resnet_app.export", *args)


@pytest.fixture
def exported(tiny_export):
    return tiny_export


def restored(tiny_run, name="ckpt-4"):
    """The run's pipeline and its model restored in this process."""
    resolved, model_dir = tiny_run
    pipeline = run_pipeline.create_run_pipeline(resolved)
    model = factory.create_run_model(
        resolved, pipeline.num_classes, pipeline.preprocessing.image_size
    )
    tf.train.Checkpoint(model=model).restore(str(model_dir / name)).expect_partial()
    return pipeline, model


def evaluation_logits(model, dataset):
    """Logits of the evaluation pipeline's real examples, ordered by example id."""
    ids, logits = [], []
    for batch in dataset:
        real = batch["mask"].numpy() > 0
        ids.append(batch["id"].numpy()[real])
        logits.append(model(batch["image"], training=False).numpy()[real])
    ids, logits = np.concatenate(ids), np.concatenate(logits)
    return logits[np.argsort(ids)]


def softmax(logits):
    shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
    return shifted / shifted.sum(axis=1, keepdims=True)


def write_images(directory, images):
    """PNG files of `images`; returns their paths."""
    os.makedirs(directory, exist_ok=True)
    paths = []
    for i, image in enumerate(images):
        path = os.path.join(directory, f"{i}.png")
        tf.io.write_file(path, tf.io.encode_png(image))
        paths.append(path)
    return paths


def test_export_in_a_process_without_resnet_app_equals_the_evaluation(tiny_run, exported, tmp_path):
    pipeline, model = restored(tiny_run)
    split = pipeline.eval_split()
    images = split.images  # uint8, as stored: the serving input.
    expected = evaluation_logits(model, pipeline.eval_dataset(16))
    assert len(expected) == len(images) == 37

    # Images of another size (40x48): the same resize-then-normalize as
    # training applies to such files, through the pipeline of an image folder
    # with the run's statistics.
    larger = np.stack([few_colour_image(40, 48, seed) for seed in range(6)])
    folder = tmp_path / "folder"
    for i, image in enumerate(larger):
        for split_name in ("train", "test"):
            write_images(folder / split_name / f"c{i}", [image])
    folder_pipeline = input_pipeline.create_pipeline(
        data_config(
            dataset=f"folder:{folder}",
            image_size=32,
            preprocessing="cifar",
            mean=pipeline.preprocessing.mean,
            std=pipeline.preprocessing.std,
        )
    )
    expected_larger = evaluation_logits(model, folder_pipeline.eval_dataset(4))

    png_list = tmp_path / "pngs.json"
    png_list.write_text(json.dumps(write_images(tmp_path / "pngs", images)))
    np.savez(tmp_path / "inputs.npz", images=images, larger=larger, png_list=str(png_list))
    script = tmp_path / "load.py"
    script.write_text(LOAD_SCRIPT)
    blocked = blocked_packages(tmp_path / "blocked", "resnet_app")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    loaded = subprocess.run(
        [sys.executable, str(script), str(exported), "inputs.npz", "outputs.npz"],
        cwd=tmp_path,
        env={**env, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": blocked},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert loaded.returncode == 0, loaded.stderr
    out = np.load(tmp_path / "outputs.npz")

    for call in ("default", "bytes"):  # PNG is lossless: the same pixels.
        np.testing.assert_allclose(out[f"{call}/logits"], expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out["larger/logits"], expected_larger, rtol=1e-5, atol=1e-6)
    probabilities = softmax(expected.astype(np.float64))
    np.testing.assert_allclose(out["default/probabilities"], probabilities, rtol=1e-5)
    top5 = np.argsort(-expected, axis=1, kind="stable")[:, :5]
    np.testing.assert_array_equal(out["default/top_k_ids"], top5)
    np.testing.assert_allclose(
        out["default/top_k_probabilities"],
        np.take_along_axis(probabilities, top5, axis=1),
        rtol=1e-5,
    )
    names = np.array(pipeline.class_names)
    np.testing.assert_array_equal(out["default/top_k_names"], names[top5])

    # Features: the mean of the last feature map, from which the logits
    # layer's own weights give the logits back.
    _, hidden = model(pipeline_images(pipeline), training=False, return_hidden=True)
    features = hidden[-1].numpy().mean(axis=(1, 2))
    np.testing.assert_allclose(out["features/features"], features, rtol=1e-5, atol=1e-6)
    kernel, bias = (w.numpy() for w in model.logits.weights)
    np.testing.assert_allclose(features @ kernel + bias, expected, rtol=1e-4, atol=1e-5)


def pipeline_images(pipeline):
    """The evaluation pipeline's normalized images, ordered by example id."""
    ids, images = [], []
    for batch in pipeline.eval_dataset(16):
        real = batch["mask"].numpy() > 0
        ids.append(batch["id"].numpy()[real])
        images.append(batch["image"].numpy()[real])
    return np.concatenate(images)[np.argsort(np.concatenate(ids))]


def test_saved_model_cli_lists_the_signatures(exported):
    cli = os.path.join(os.path.dirname(sys.executable), "saved_model_cli")
    shown = subprocess.run(
        [cli, "show", "--all", "--dir", str(exported)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
    )
    assert shown.returncode == 0, shown.stderr
    for signature in ("serving_default", "serving_bytes", "features"):
        assert f"signature_def['{signature}']" in shown.stdout
    for output in ("probabilities", "top_k_ids", "top_k_names", "logits", "features"):
        assert f"outputs['{output}']" in shown.stdout
    labels = (exported / "assets.extra" / "labels.txt").read_text().splitlines()
    assert len(labels) == 10 and labels[0] == "circle"  # The shapes classes, in label order.


def test_imagenet_preprocessing_of_files_of_any_size(tmp_path):
    """serving_bytes and serving_default crop as the evaluation pipeline does."""
    sizes = [(40, 60), (72, 48), (50, 50)]
    originals = [few_colour_image(h, w, seed) for seed, (h, w) in enumerate(sizes)]
    for i, image in enumerate(originals):
        for split_name in ("train", "test"):
            write_images(tmp_path / split_name / f"c{i}", [image])
    pipeline = input_pipeline.create_pipeline(
        data_config(dataset=f"folder:{tmp_path}", image_size=32, preprocessing="imagenet")
    )
    assert pipeline.preprocessing.eval_resize == 37
    model = create_model("tiny", num_classes=3)
    model.build((None, 32, 32, 3))
    expected = evaluation_logits(model, pipeline.eval_dataset(3))
    served = savedmodel.ServingModel(model, pipeline.preprocessing, pipeline.class_names, top_k=2)
    files = sorted((tmp_path / "test").rglob("*.png"))
    encoded = tf.constant([path.read_bytes() for path in files])
    from_bytes = served.serve_bytes(encoded)["logits"].numpy()
    np.testing.assert_allclose(from_bytes, expected, rtol=1e-5, atol=1e-6)
    for i, image in enumerate(originals):  # One size per call: a batch shares its size.
        from_pixels = served.serve_images(image[None])
        np.testing.assert_allclose(from_pixels["logits"][0], expected[i], rtol=1e-5, atol=1e-6)
        assert from_pixels["top_k_ids"].shape == (1, 2)


def test_only_an_old_export_is_ever_replaced(tiny_run, exported, tmp_path, monkeypatch):
    _, model_dir = tiny_run
    target = tmp_path / "model"
    shutil.copytree(exported, target)  # An export of ckpt-4.
    served, source = savedmodel.load(str(model_dir), "ckpt-2", top_k=3)
    with pytest.raises(ConfigError, match="holds an export; add --overwrite"):
        savedmodel.save(served, source, str(target))

    def broken_save(obj, directory, signatures=None):
        (tmp_path / "was_staged_at").write_text(directory)
        with open(os.path.join(directory, "saved_model.pb"), "wb") as f:
            f.write(b"half")
        raise OSError("disk full")

    monkeypatch.setattr(tf.saved_model, "save", broken_save)
    with pytest.raises(OSError, match="disk full"):
        savedmodel.save(served, source, str(target), overwrite=True)
    monkeypatch.undo()
    assert sorted(os.listdir(tmp_path)) == ["model", "was_staged_at"]  # No partial directory.

    def checkpoint_of(directory):
        return json.loads((directory / "assets.extra" / "export_info.json").read_text())

    assert checkpoint_of(target)["checkpoint"] == "ckpt-4"  # The old export, intact.
    savedmodel.save(served, source, str(target), overwrite=True)
    info = checkpoint_of(target)
    assert info["checkpoint"] == "ckpt-2" and info["step"] == 2 and info["top_k"] == 3
    assert sorted(os.listdir(tmp_path)) == ["model", "was_staged_at"]

    # Never anything else, with --overwrite or not: a folder of other files,
    # the run itself, or a folder holding the run.
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    run = tmp_path / "runs" / "run"
    shutil.copytree(model_dir, run)
    for directory, message in [
        (other, "is a non-empty directory that is not an export"),
        (run, "holds the run"),
        (tmp_path / "runs", "holds the run"),
        (run / "ckpt-4", "named like a checkpoint of the run"),
    ]:
        with pytest.raises(ConfigError, match=message):
            savedmodel.save(served, {**source, "model_dir": str(run)}, str(directory), True)
    assert (other / "notes.txt").read_text() == "mine"
    assert sorted(os.listdir(run)) == sorted(os.listdir(model_dir))

    # A link to an export: the export it points to is replaced, the link stays.
    link = tmp_path / "current"
    link.symlink_to(target)
    savedmodel.save(served, {**source, "checkpoint": "ckpt-x"}, str(link), overwrite=True)
    assert link.is_symlink() and checkpoint_of(link)["checkpoint"] == "ckpt-x"
    assert not [p for p in os.listdir(tmp_path) if ".replaced-" in p or ".partial-" in p]


@pytest.mark.parametrize(
    "args,message",
    [
        ([], "--export_dir is not set"),
        (["--export_dir={tmp}/out", "--model_dir={tmp}"], "must be a run directory"),
        (["--export_dir={file}", "--model_dir={run}"], "is a file; name a directory"),
        (["--export_dir={tmp}/out", "--model_dir={run}", "--checkpoint=all"], "takes one"),
        (["--export_dir={tmp}/out", "--model_dir={run}", "--checkpoint=9"], "ckpt-2, ckpt-4"),
        (["--export_dir={tmp}", "--model_dir={run}", "--overwrite"], "that is not an export"),
    ],
)
def test_mistakes_are_one_line(tiny_run, tmp_path, args, message):
    _, model_dir = tiny_run
    (tmp_path / "file").write_text("")
    args = [a.format(tmp=tmp_path, run=model_dir, file=tmp_path / "file") for a in args]
    assert message in error_line(export_cli(*args))
    assert not (tmp_path / "out").exists()


def test_a_run_without_data_info_reads_its_dataset_instead(tiny_run, tmp_path):
    """Runs trained before data_info.json existed: the dataset gives the same answers."""
    _, model_dir = tiny_run
    copy = tmp_path / "run"
    shutil.copytree(model_dir, copy)
    recorded = run_pipeline.read_data_info(str(copy))
    (copy / run_dir.DATA_INFO_FILE).unlink()
    served, _ = savedmodel.load(str(copy))
    assert served.class_names == recorded[0]
    measured = dataclasses.replace(served.preprocessing, dtype=recorded[1].dtype)
    assert measured == recorded[1]

    (copy / run_dir.DATA_INFO_FILE).write_text('{"class_names": ["a"]')
    with pytest.raises(ConfigError, match=r"data_info.json is damaged .*; delete it"):
        savedmodel.load(str(copy))


def test_a_bf16_run_serves_in_float32_on_images_rounded_to_bfloat16(tmp_path):
    """A bf16 run serves in float32 (a portable model) on images rounded to bfloat16."""
    bf16 = runs.small_config(tmp_path, "train.precision=bf16", train_steps=2)
    model_dir = tmp_path / "run"
    loop.train_and_evaluate(bf16, str(model_dir))
    pipeline, model = restored((bf16, model_dir), "ckpt-2")  # A float32 model.
    assert pipeline.preprocessing.dtype == "bfloat16"
    assert model.compute_dtype == "float32"
    expected = evaluation_logits(model, pipeline.eval_dataset(16))
    served, _ = savedmodel.load(str(model_dir))
    logits = served.serve_images(pipeline.eval_split().images)["logits"].numpy()
    np.testing.assert_allclose(logits, expected, rtol=1e-5, atol=1e-6)
