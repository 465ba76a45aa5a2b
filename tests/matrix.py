"""The no-traceback matrix: every command on every kind of dataset, every export format.

Each cell runs a command as a user would, and either works (exit 0) or refuses in one line
(exit 2, one `error:` line). The cells of one kind share one tiny run: train it, evaluate,
export and predict with it, and run the tools on its data. Pairwise, not the full product:
every command runs on every kind, and every export format and TFLite variant once per kind of
classifier head (`FULL_EXPORT`), since what an export holds does not depend on where the images
came from; the other kinds export the SavedModel. tests/slow_tier.py names the kinds in the
slow tier.
"""

import os

import numpy as np

from resnet_app.data import shapes
from tests import cifar_files, own_data
from tests.commands import run_command
from tests.tfds_mock import closed_port

TRAIN = [
    "--model=tiny",
    "--batch_size=8",
    "--train_steps=2",
    "--eval_every=2",
    "--set=data.image_size=16",
    "--set=data.eval_examples=12",
]
TFLITE_VARIANTS = ("none", "float16", "dynamic", "int8")
# The kinds whose run is exported to every format and variant: one per head type.
FULL_EXPORT = {"single-label": "shapes", "multi-label": "multi-label csv", "synthetic": "synthetic"}


def make_datasets(root):
    """{kind: --dataset value} of every kind, written under `root` (small ones)."""
    images, labels = shapes.generate("train", 48, seed=3)
    names = own_data.write_pngs(str(root / "pngs"), images)
    for split, part in (("train", slice(0, 36)), ("val", slice(36, 48))):
        for i, (image, label) in enumerate(zip(images[part], labels[part], strict=True)):
            folder = root / "folder" / split / shapes.CLASS_NAMES[label]
            own_data.write_pngs(str(folder), image[None], prefix=f"{i}_")
    splits = ["train"] * 36 + ["test"] * 12
    single = [(f"pngs/{n}", shapes.CLASS_NAMES[y], s) for n, y, s in zip(names, labels, splits)]
    own_data.write_table(root / "table.csv", single)
    tags = [f"{shapes.CLASS_NAMES[y]} {'big' if i % 2 else 'small'}" for i, y in enumerate(labels)]
    multi = [(f"pngs/{n}", t, s) for n, t, s in zip(names, tags, splits)]
    own_data.write_table(root / "tags.csv", multi)
    own_data.shapes_shards(str(root / "shards"), train_sizes=(10, 14), eval_sizes=(6, 6))
    grey, ids, arrays = images.mean(axis=-1).astype(np.uint8), labels.astype(np.uint8), {}
    for split, part in (("train", slice(0, 36)), ("test", slice(36, 48))):
        arrays[(split, "images")], arrays[(split, "labels")] = grey[part], ids[part]
    own_data.write_idx(str(root / "idx"), arrays)  # Greyscale, as MNIST's.
    cifar = cifar_files.write_archive(str(root / "cifar"), "cifar10", "binary", tarball=True)
    hf_splits = {"train": (images[:36], labels[:36]), "test": (images[36:], labels[36:])}
    own_data.write_hf(root / "hub", hf_splits, shapes.CLASS_NAMES, shards=2)
    np.save(root / "one.npy", images[0])
    own_data.write_pngs(str(root / "photos"), images[:2], prefix="photo")
    return {
        "shapes": "shapes",
        "synthetic": "synthetic",
        "folder": f"folder:{root / 'folder'}",
        "csv": f"csv:{root / 'table.csv'}",
        "multi-label csv": f"csv:{root / 'tags.csv'}",
        "tfrecord": f"tfrecord:{root / 'shards'}",
        "idx": f"idx:{root / 'idx'}",
        "cifar": f"cifar:{cifar}",
        "hf": f"hf:{root / 'hub'}",
        "tfds (offline)": "cifar10",
    }


def outcome(result):
    """ "works", ("refuses", the error line), or the failure as text."""
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    if "Traceback" in result.stderr:
        return f"traceback:\n{result.stderr[-3000:]}"
    if result.returncode == 0:
        return "works"
    if result.returncode == 2 and len(errors) == 1:
        return ("refuses", errors[0])
    return f"exit {result.returncode}, {len(errors)} error lines:\n{result.stderr[-3000:]}"


def run_kind(kind, dataset, root, env=None):
    """{cell: outcome} of every command on one kind of dataset (`env`: variables added)."""
    work = root / ("cells_" + kind.replace(" ", "_").replace("(", "").replace(")", ""))
    work.mkdir()
    env = {
        "RESNET_APP_NETWORK_PROBE": closed_port(),
        "TFDS_DATA_DIR": str(root / "tfds"),
        "MPLBACKEND": "Agg",
        **(env or {}),
    }
    data = [f"--dataset={dataset}", f"--set=data.data_dir={root / 'cache'}"]
    if dataset == "shapes":
        data.append("--set=data.train_examples=48")
    if dataset.startswith("tfrecord:"):  # build_imagenet_data.py's labels start at 1.
        data.append("--set=data.records.label_offset=1")
    run, exported = work / "run", work / "export"
    photos = [str(root / "photos" / name) for name in sorted(os.listdir(root / "photos"))]
    cells = {}

    def cell(name, command, *args):
        cells[name] = outcome(run_command(command, *args, env=env))
        return cells[name]

    trained = cell("train", "resnet_app.train", *data, *TRAIN, f"--model_dir={run}") == "works"
    cell("schedule", "resnet_app.tools.lr_schedule", *data, *TRAIN)
    records = ["--label_offset=1"] if dataset.startswith("tfrecord:") else []
    if dataset == "shapes":
        records.append("--train_examples=48")  # Not the default 50,000 images to draw.
    show = [f"--dataset={dataset}", f"--data_dir={root / 'cache'}", f"--out={work / 'batch.png'}"]
    cell(
        "show-batch", "resnet_app.tools.show_batch", *show, "--count=4", "--image_size=16", *records
    )
    lr_find = ["--model=tiny", "--batch_size=8", "--set=data.image_size=16", "--steps=6"]
    lr_find += [f"--csv={work / 'lr.csv'}", f"--plot={work / 'lr.png'}"]
    cell("lr-find", "resnet_app.tools.lr_find", *data, *lr_find)
    if not trained:
        # The launcher's workers meet the same mistake: one line, no restart.
        launch = ["--workers=2", "--", *data, *TRAIN, f"--model_dir={work / 'launched'}"]
        cell("launch", "resnet_app.launch", *launch)
        return cells
    # report: evaluate's pass and report, and its page.
    cell("report", "resnet_app.report", f"--model_dir={run}", f"--report_dir={work / 'r'}")
    cell("average", "resnet_app.tools.average", f"--model_dir={run}", "--bn_batches=1")
    cell("plot", "resnet_app.tools.plot_metrics", str(run), f"--out={work / 'curves.png'}")
    cell("predict run", "resnet_app.predict", f"--model_dir={run}", *photos)
    variants = ",".join(TFLITE_VARIANTS)
    exports = {
        "": ["--format=tflite,onnx", f"--quantize={variants}"],
        # Without int8, which needs training images to calibrate on.
        " (no int8)": ["--format=tflite,onnx", "--quantize=none,float16,dynamic"],
    }
    if kind not in FULL_EXPORT.values():
        exports = {"": []}  # The SavedModel.
    for suffix, flags in exports.items():
        target = f"{exported}{suffix.strip(' ()').replace(' ', '_')}"
        export = [f"--model_dir={run}", f"--export_dir={target}", "--eval_examples=4", *flags]
        if cell(f"export{suffix}", "resnet_app.export", *export) != "works":
            continue
        # predict on each format (the TFLite variants share a runner).
        for name in ("saved_model", "model.tflite", "model.onnx")[: 3 if flags else 1]:
            path = target if name == "saved_model" else os.path.join(target, name)
            cell(f"predict {name}", "resnet_app.predict", f"--export_dir={path}", *photos)
        break
    return cells


def check(cells, expected_refusals):
    """Every cell works or refuses in one line; exactly the expected ones refuse."""
    failures = {
        name: result
        for name, result in cells.items()
        if isinstance(result, str) and result != "works"
    }
    assert not failures, "\n\n".join(f"{name}: {result}" for name, result in failures.items())
    refused = {name: result[1] for name, result in cells.items() if result != "works"}
    assert set(refused) == set(expected_refusals), refused
    for name, fragment in expected_refusals.items():
        assert fragment in refused[name], (name, refused[name])
