"""TFLite and ONNX exports: each file, loaded without resnet_app, against the trained model.

The reference is the model restored in this process from the run's
checkpoint, applied to the evaluation images with NumPy's softmax: never the
export's own report.
"""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from resnet_app import config
from resnet_app.common.errors import ConfigError
from resnet_app.data import run_pipeline
from resnet_app.nets import factory
from tests import runs
from tests.commands import REPO, blocked_packages, error_line, run_command

ALL_TFLITE = "none,float16,dynamic,int8"

# Runs each exported file with its runtime alone: LiteRT and onnxruntime.
LOAD_SCRIPT = """
import os, sys
import numpy as np
from ai_edge_litert.interpreter import Interpreter
import onnxruntime

export_dir, inputs, output = sys.argv[1:]
images = np.load(inputs)["images"]
results = {}
for name in os.listdir(export_dir):
    path = os.path.join(export_dir, name)
    if name.endswith(".tflite"):
        runner = Interpreter(model_path=path).get_signature_runner("serving_default")
        results[name] = runner(images=images)["probabilities"]
    elif name.endswith(".onnx"):
        session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
        results[name] = session.run(["probabilities"], {"images": images})[0]
assert "tensorflow" not in sys.modules
assert not [m for m in sys.modules if m.split(".")[0] == "resnet_app"]
np.savez(output, **results)
"""


def softmax(logits):
    shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
    return shifted / shifted.sum(axis=1, keepdims=True)


def run_files_elsewhere(export_dir, images, tmp_path):
    """Every .tflite and .onnx file's probabilities, from a process without resnet_app or TF."""
    np.savez(tmp_path / "inputs.npz", images=images)
    script = tmp_path / "load.py"
    script.write_text(LOAD_SCRIPT)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    blocked = blocked_packages(tmp_path / "blocked", "resnet_app")
    loaded = subprocess.run(
        [sys.executable, str(script), str(export_dir), "inputs.npz", "outputs.npz"],
        cwd=tmp_path,
        env={**env, "PYTHONPATH": blocked},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert loaded.returncode == 0, loaded.stderr
    return dict(np.load(tmp_path / "outputs.npz"))


def reference(model_dir, checkpoint="ckpt-4"):
    """The run's evaluation images (uint8, as stored), the restored model, the normalized images."""
    resolved = config.read_run_config(str(model_dir))
    pipeline = run_pipeline.create_run_pipeline(resolved, model_dir=str(model_dir))
    model = factory.create_run_model(
        resolved, pipeline.num_classes, pipeline.preprocessing.image_size
    )
    tf.train.Checkpoint(model=model).restore(str(model_dir / checkpoint)).expect_partial()
    images = pipeline.eval_split().images
    prep = pipeline.preprocessing
    normalized = (images.astype(np.float32) - np.float32(prep.mean)) / np.float32(prep.std)
    return images, model, normalized


def export(model_dir, export_dir, *flags):
    result = run_command(
        "resnet_app.export", f"--model_dir={model_dir}", f"--export_dir={export_dir}", *flags
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def all_formats(tiny_run, tmp_path_factory):
    _, model_dir = tiny_run
    export_dir = tmp_path_factory.mktemp("formats") / "model"
    record = export(model_dir, export_dir, "--format=tflite,onnx", f"--quantize={ALL_TFLITE}")
    return model_dir, export_dir, record


def test_every_file_matches_the_trained_model_in_a_process_without_resnet_app(
    all_formats, tmp_path
):
    model_dir, export_dir, record = all_formats
    images, model, normalized = reference(model_dir)
    expected = softmax(model(normalized, training=False).numpy().astype(np.float64))
    outputs = run_files_elsewhere(export_dir, images, tmp_path)
    assert sorted(outputs) == [
        "model.onnx",
        "model.tflite",
        "model_dynamic.tflite",
        "model_float16.tflite",
        "model_int8.tflite",
    ]
    for name in ("model.tflite", "model.onnx"):  # float32: the same numbers.
        np.testing.assert_allclose(outputs[name], expected, atol=1e-4)
        np.testing.assert_array_equal(outputs[name].argmax(1), expected.argmax(1))
    np.testing.assert_allclose(outputs["model_float16.tflite"], expected, atol=1e-2)
    for name in ("model_dynamic.tflite", "model_int8.tflite"):  # Probabilities, roughly.
        np.testing.assert_allclose(outputs[name].sum(axis=1), 1, atol=2e-2)
        assert np.abs(outputs[name] - expected).max() < 0.5
    # The report says the same of each file, on the same images.
    rows = {row["format"]: row for row in record["formats"]}
    assert set(rows) == {"saved_model", "onnx", *(f"tflite_{q}" for q in ALL_TFLITE.split(","))}
    resolved = config.read_run_config(str(model_dir))
    labels = run_pipeline.create_run_pipeline(resolved, model_dir=str(model_dir))
    labels = labels.eval_split().labels
    for name, file in (("tflite_none", "model.tflite"), ("onnx", "model.onnx")):
        assert rows[name]["top1"] == pytest.approx(np.mean(outputs[file].argmax(1) == labels))
        assert rows[name]["agreement"] == 1.0 and rows[name]["max_prob_diff"] <= 1e-4
        assert rows[name]["size_bytes"] == os.path.getsize(export_dir / file)
    report = json.loads((export_dir / "export_report.json").read_text())
    assert report["num_examples"] == len(images) and report["formats"] == record["formats"]
    info = json.loads((export_dir / "model_info.json").read_text())
    assert info["input_size"] == 32 and len(info["class_names"]) == 10


def test_predict_gives_the_same_answers_from_every_format(all_formats, tmp_path):
    model_dir, export_dir, _ = all_formats
    images, _, _ = reference(model_dir)
    paths = []
    for i, image in enumerate(images[:5]):
        path = tmp_path / f"{i}.png"
        tf.io.write_file(str(path), tf.io.encode_png(image))
        paths.append(str(path))
    lines = {}
    for target in (export_dir, export_dir / "model.tflite", export_dir / "model.onnx"):
        result = run_command("resnet_app.predict", f"--export_dir={target}", "--json", *paths)
        assert result.returncode == 0, result.stderr
        lines[target.name] = [json.loads(line) for line in result.stdout.splitlines()]
    first = [[entry["top_k"][0]["name"] for entry in lines[name]] for name in lines]
    assert first[0] == first[1] == first[2]
    for name in ("model.tflite", "model.onnx"):
        for ours, saved in zip(lines[name], lines[export_dir.name], strict=True):
            assert [t["id"] for t in ours["top_k"]] == [t["id"] for t in saved["top_k"]]
            for a, b in zip(ours["top_k"], saved["top_k"], strict=True):
                assert a["probability"] == pytest.approx(b["probability"], abs=1e-4)


def test_temperature_and_flip_reach_every_format(tiny_run, tmp_path):
    _, tiny_dir = tiny_run
    model_dir = runs.copy_with_temperature(tiny_dir, tmp_path / "run", 2.5, step=4)
    export_dir = tmp_path / "export"
    export(model_dir, export_dir, "--format=tflite,onnx", "--tta=flip", "--eval_examples=8")
    images, model, normalized = reference(model_dir)
    logits = model(normalized, training=False).numpy().astype(np.float64)
    flipped = model(normalized[:, :, ::-1, :], training=False).numpy().astype(np.float64)
    expected = (softmax(logits / 2.5) + softmax(flipped / 2.5)) / 2
    outputs = run_files_elsewhere(export_dir, images, tmp_path)
    for name in ("model.tflite", "model.onnx"):
        np.testing.assert_allclose(outputs[name], expected, atol=1e-4)
    saved = tf.saved_model.load(str(export_dir)).signatures["serving_default"]
    np.testing.assert_allclose(
        saved(images=tf.constant(images))["probabilities"].numpy(), expected, atol=1e-5
    )
    report = json.loads((export_dir / "export_report.json").read_text())
    assert report["temperature"] == 2.5 and report["tta"] == "flip" and report["num_examples"] == 8


def test_bad_export_requests_are_one_line(tiny_run, tmp_path):
    _, model_dir = tiny_run
    out = f"--export_dir={tmp_path / 'out'}"
    cases = [
        (["--format=pdf"], "--format=pdf: use one of saved_model, tflite, onnx"),
        (["--format=tflite", "--quantize=int4"], "--quantize=int4: use one of"),
        (["--quantize=int8"], "--quantize applies to TFLite files; add --format=tflite"),
        (["--tta=crops"], "--tta=crops: use one of none, flip"),
    ]
    for flags, message in cases:
        result = run_command("resnet_app.export", f"--model_dir={model_dir}", out, *flags)
        assert message in error_line(result)
    assert not os.path.exists(tmp_path / "out")


def run_on_other_data(tiny_dir, tmp_path, dataset):
    """A copy of the tiny run whose config.yaml names `dataset` instead of shapes."""
    model_dir = tmp_path / "run"
    shutil.copytree(tiny_dir, model_dir)
    text = (model_dir / "config.yaml").read_text()
    (model_dir / "config.yaml").write_text(text.replace("dataset: shapes", f"dataset: {dataset}"))
    return model_dir


def test_int8_without_the_training_data_and_onnx_without_its_converter(tiny_run, tmp_path):
    _, tiny_dir = tiny_run
    model_dir = run_on_other_data(tiny_dir, tmp_path, "folder:/gone")
    result = run_command(
        "resnet_app.export",
        f"--model_dir={model_dir}",
        f"--export_dir={tmp_path / 'out'}",
        "--format=tflite",
        "--quantize=int8",
    )
    assert "--quantize=int8 needs the run's training split" in error_line(result)
    # A converter that is not installed: a package of that name that fails to import.
    fake = blocked_packages(tmp_path / "fake", "tf2onnx")
    result = run_command(
        "resnet_app.export",
        f"--model_dir={tiny_dir}",
        f"--export_dir={tmp_path / 'out2'}",
        "--format=onnx",
        env={"PYTHONPATH": f"{fake}{os.pathsep}{REPO}"},
    )
    assert "needs the optional converter (tf2onnx is not installed)" in error_line(result)
    assert not os.path.exists(tmp_path / "out2")


def test_a_run_on_synthetic_data_exports_without_a_parity_report(tiny_run, tmp_path):
    _, tiny_dir = tiny_run
    model_dir = run_on_other_data(tiny_dir, tmp_path, "synthetic")
    # Synthetic data has no images to compare the formats on: a warning, not a traceback.
    result = run_command(
        "resnet_app.export",
        f"--model_dir={model_dir}",
        f"--export_dir={tmp_path / 'out'}",
        "--format=tflite",
    )
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    assert "No parity report" in result.stderr and "synthetic data has no images" in result.stderr
    assert (tmp_path / "out" / "model.tflite").is_file()
    result = run_command(
        "resnet_app.export",
        f"--model_dir={model_dir}",
        f"--export_dir={tmp_path / 'out2'}",
        "--format=tflite",
        "--quantize=int8",
    )
    line = error_line(result)
    assert "--quantize=int8 needs the run's training split" in line
    assert "synthetic data has no images" in line


# The family's layers in one tiny network: a deep stem with the strided-conv
# pool, grouped bottlenecks, squeeze-excitation or ECA, the average-pool
# shortcut, dropout (inert at export).
FAMILY = [
    "model.block=bottleneck",
    "model.units=[1, 1]",
    "model.widths=[8, 8]",
    "model.strides=[1, 2]",
    "model.groups=4",
    "model.base_width=16",
    "model.stem=deep",
    "model.stem_filters=8",
    "model.init_max_pool=true",
    "model.replace_stem_pool=true",
    "model.shortcut=avg_projection",
    "model.dropout=0.1",
]


@pytest.mark.parametrize("attention", ["se", "eca"])
def test_the_familys_layers_export_to_every_format_with_the_trained_numbers(attention, tmp_path):
    from resnet_app.engine import loop

    ratio = ["model.se_ratio=0.5"] if attention == "se" else []
    sets = [*FAMILY, f"model.attention={attention}", *ratio]
    resolved = runs.small_config(tmp_path, *sets, train_steps=4, eval_every=4)
    model_dir = tmp_path / "run"
    loop.train_and_evaluate(resolved, str(model_dir))
    record = export(model_dir, tmp_path / "model", "--format=tflite,onnx", "--quantize=none")
    images, model, normalized = reference(model_dir)
    expected = softmax(model(normalized, training=False).numpy().astype(np.float64))
    outputs = run_files_elsewhere(tmp_path / "model", images, tmp_path)
    assert sorted(outputs) == ["model.onnx", "model.tflite"]
    for name in outputs:
        np.testing.assert_allclose(outputs[name], expected, atol=1e-4, err_msg=name)
    rows = {row["format"]: row for row in record["formats"]}
    assert rows["onnx"]["agreement"] == 1.0 and rows["tflite_none"]["max_prob_diff"] <= 1e-4


def test_a_new_format_is_one_module_and_one_line(tiny_run, tmp_path, monkeypatch):
    """Registered with one line, a format (tests/zipped_format.py) is written, checked and run."""
    from resnet_app.export import classify, deploy, formats, savedmodel

    _, model_dir = tiny_run
    request = deploy.Request(formats=("saved_model", "zipped"))
    with pytest.raises(ConfigError, match="--format=zipped: use one of saved_model, tflite, onnx"):
        deploy.check_request(request)
    zipped = formats.Format("zipped", ".zip", "tests.zipped_format")
    monkeypatch.setitem(formats.FORMATS, "zipped", zipped)
    deploy.check_request(request)
    run_config = config.read_run_config(str(model_dir))
    served, source = savedmodel.load(str(model_dir), "latest", 5)
    report = {}

    def more(staged):
        report.update(deploy.write_formats(staged, served, source, run_config, request))

    export_dir = savedmodel.save(served, source, str(tmp_path / "out"), False, more=more)
    rows = {row["format"]: row for row in report["formats"]}
    assert set(rows) == {"saved_model", "zipped"}
    assert rows["zipped"]["file"] == "model.zip"
    assert rows["zipped"]["agreement"] == 1.0 and rows["zipped"]["max_prob_diff"] < 1e-6
    # predict finds the format by its suffix and answers as the SavedModel does.
    images, _, _ = reference(model_dir)
    encoded = [tf.io.encode_png(image).numpy() for image in images[:4]]
    by_file = classify.load_classifier(os.path.join(export_dir, "model.zip"), None)
    by_saved_model = classify.load_classifier(export_dir, None)
    for key in ("top_k_ids", "top_k_probabilities"):
        np.testing.assert_allclose(
            by_file(images=tf.constant(encoded))[key].numpy(),
            by_saved_model(images=tf.constant(encoded))[key].numpy(),
            atol=1e-6,
        )
