"""`python -m resnet_app.predict` on image files, against the in-process model and NumPy."""

import json
import os
import shutil

import numpy as np
import pytest
import tensorflow as tf

from tests.commands import error_line, run_command
from tests.image_files import encode_bmp
from tests.test_durable import dead_pid
from tests.test_export import evaluation_logits, restored, softmax, write_images


def predict_cli(*args):
    return run_command("resnet_app.predict", *args)


@pytest.fixture(scope="module")
def images(tiny_run, tmp_path_factory):
    """Five test images as PNG, BMP and JPEG files, unreadable files among them, and the
    expected top-7 (ids, probabilities, names) of the readable ones from the in-process model."""
    pipeline, model = restored(tiny_run)
    logits = evaluation_logits(model, pipeline.eval_dataset(16))[:5]
    root = tmp_path_factory.mktemp("predict")
    good = root / "good"  # Only the five readable images, for the directory test.
    paths = write_images(good, pipeline.eval_split().images[:5])
    # The JPEG's reference is its decoded pixels, through the same pipeline
    # preprocessing (normalization with the run's statistics).
    (good / "sub").mkdir(parents=True)
    jpeg = str(good / "sub" / "4.JPG")  # In a subfolder, with an upper-case extension.
    tf.io.write_file(jpeg, tf.io.encode_jpeg(pipeline.eval_split().images[4], quality=95))
    decoded = tf.io.decode_jpeg(tf.io.read_file(jpeg), channels=3).numpy().astype(np.float64)
    mean, std = np.array(pipeline.preprocessing.mean), np.array(pipeline.preprocessing.std)
    logits[4] = model(((decoded - mean) / std)[None].astype(np.float32), training=False)[0]
    os.remove(paths[4])
    paths[4] = jpeg
    (root / "garbage.png").write_bytes(b"not an image at all")
    (root / "truncated.png").write_bytes((good / "0.png").read_bytes()[:60])
    (root / "empty").mkdir()
    # What a directory argument skips: other files, hidden files and folders.
    (good / "notes.txt").write_text("not an image")
    (good / ".hidden.png").write_bytes(b"not an image")
    (good / ".thumbnails").mkdir()
    (good / ".thumbnails" / "0.png").write_bytes(b"not an image")
    # A BMP of image 3: lossless, so the same reference.
    bmp = str(good / "3.bmp")
    with open(bmp, "wb") as f:
        f.write(encode_bmp(pipeline.eval_split().images[3]))
    os.remove(paths[3])
    paths[3] = bmp
    probabilities = softmax(logits.astype(np.float64))
    top7 = np.argsort(-probabilities, axis=1, kind="stable")[:, :7]
    expected = [
        (list(ids), list(p[ids]), [pipeline.class_names[i] for i in ids])
        for ids, p in zip(top7, probabilities)
    ]
    return root, paths, expected


def test_predict_from_an_export(tiny_export, images):
    root, paths, expected = images
    export_dir = tiny_export
    given = [paths[0], str(root / "garbage.png"), paths[1], str(root / "missing.png")]
    given += [str(root / "empty"), paths[2], str(root / "truncated.png"), paths[3], paths[4]]
    result = predict_cli(f"--export_dir={export_dir}", "--top_k=3", "--batch_size=4", *given)
    assert result.returncode == 1, result.stderr  # Some files failed.
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert errors == [
        f"error: {root / 'garbage.png'}: not a readable image (Unknown image file format. "
        "One of JPEG, JPEG XL, PNG, GIF, BMP, WebP required.)",
        f"error: {root / 'missing.png'}: No such file or directory",
        f"error: {root / 'empty'}: a directory without image files (.jpg, .jpeg, .png, .bmp, .gif)",
        errors[3],  # The PNG decoder's own words, checked below.
    ]
    assert errors[3].startswith(f"error: {root / 'truncated.png'}: not a readable image (")
    lines = result.stdout.splitlines()
    assert [line.split(": ")[0] for line in lines] == paths  # Every good file, in order.
    for line, (_, probabilities, names) in zip(lines, expected):
        shown = [item.rsplit(" ", 1) for item in line.split(": ", 1)[1].split(", ")]
        assert [name for name, _ in shown] == names[:3]
        np.testing.assert_allclose([float(p) for _, p in shown], probabilities[:3], atol=6e-5)


def test_an_export_killed_between_its_renames_is_read_where_it_was_set_aside(
    tiny_export, images, tmp_path
):
    root, paths, expected = images
    aside = tmp_path / f"export.replaced-{dead_pid()}"
    shutil.copytree(tiny_export, aside)  # No tmp_path/export: the kill came between the renames.
    result = predict_cli(f"--export_dir={tmp_path / 'export'}", "--top_k=2", paths[0])
    assert result.returncode == 0, result.stderr
    (warning,) = [line for line in result.stderr.splitlines() if "is missing" in line]
    assert f"reading the export it set aside, {aside}" in warning, warning
    shown = [item.rsplit(" ", 1)[0] for item in result.stdout.split(": ", 1)[1].split(", ")]
    assert shown == expected[0][2][:2]
    assert os.listdir(tmp_path) == [aside.name]  # Read where it is; the next export moves it.


def test_predict_from_a_run_directory_as_json(tiny_run, images):
    _, model_dir = tiny_run
    root, paths, expected = images
    # 7 classes: more than an export's default 5, which --model_dir can give.
    # The directory stands for its image files, in sorted order.
    assert sorted(paths) == paths
    result = predict_cli(f"--model_dir={model_dir}", "--json", "--top_k=7", str(root / "good"))
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in result.stdout.splitlines()]
    assert [r["image"] for r in records] == paths
    for record, (ids, probabilities, names) in zip(records, expected):
        assert [t["id"] for t in record["top_k"]] == ids
        assert [t["name"] for t in record["top_k"]] == names
        got = [t["probability"] for t in record["top_k"]]
        np.testing.assert_allclose(got, probabilities, rtol=1e-5)


@pytest.mark.parametrize(
    "args,message",
    [
        (["{image}"], "give --export_dir (an exported SavedModel) or --model_dir"),
        (["--export_dir={tmp}", "--model_dir={run}", "{image}"], "not both"),
        (["--model_dir={run}"], "no images given"),
        (["--export_dir={tmp}", "{image}"], "holds no SavedModel"),
        (["--export_dir={broken}", "{image}"], "the SavedModel cannot be loaded"),
        (["--model_dir={tmp}", "{image}"], "must be a run directory"),
        (
            ["--model_dir={run}", "--batch_size=0", "{image}"],
            "--batch_size must be a whole number >= 1, got 0",
        ),
    ],
)
def test_mistakes_are_one_line(tiny_run, images, tmp_path, args, message):
    _, model_dir = tiny_run
    image = images[1][0]
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "saved_model.pb").write_bytes(b"\x08\x01 not a protocol buffer")
    args = [a.format(tmp=tmp_path, run=model_dir, image=image, broken=broken) for a in args]
    assert message in error_line(predict_cli(*args))


def test_odd_names_and_bombs_on_an_ascii_stdout(tiny_export, images, tmp_path):
    """Issue 38: a file named with a non-ASCII character and a byte that is no UTF-8,
    on an ASCII stdout, is classified and named; a PNG whose header gives
    10000 x 10000 pixels is refused by its header, in one line."""
    _, paths, expected = images
    folder = os.fsencode(tmp_path)
    with open(paths[0], "rb") as source, open(folder + b"/caf\xc3\xa9-\xe9.png", "wb") as f:
        f.write(source.read())  # Image 0, renamed.
    named = os.fsdecode(folder + b"/caf\xc3\xa9-\xe9.png")  # As the shell passes it.
    bomb = tmp_path / "bomb.png"
    bomb.write_bytes(  # The header only: nothing that a decoder could read.
        b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x27\x10\x00\x00\x27\x10\x08\x02"
    )
    result = run_command(
        "resnet_app.predict",
        f"--export_dir={tiny_export}",
        "--top_k=2",
        named,
        str(bomb),
        env={"PYTHONIOENCODING": "ascii"},
    )
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == 1, result.stderr  # The bomb failed.
    [line] = result.stdout.splitlines()
    name_shown, classes = line.split(": ", 1)
    assert name_shown == f"{tmp_path}/caf\\xe9-\\xe9.png"  # Both escaped, on ASCII.
    shown = [item.rsplit(" ", 1) for item in classes.split(", ")]
    _, probabilities, names = expected[0]
    assert [name for name, _ in shown] == names[:2]
    np.testing.assert_allclose([float(p) for _, p in shown], probabilities[:2], atol=6e-5)
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert errors == [
        f"error: {bomb}: 10000x10000 pixels (100,000,000), more than the limit of 89,478,485 "
        "(a guard against decompression bombs); pass a larger --max_image_pixels if the "
        "image is meant to be this large"
    ]
