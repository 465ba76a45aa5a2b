"""Our `--format=timm` and `--format=torchvision` files loaded by the real libraries.

    python scripts/torch_parity.py --torch_python=/tmp/torch/bin/python
    python scripts/torch_parity.py --torch_python=... --model_dir=RUN   # a trained run too

Run with the project's Python: for each architecture, a network at random init
(BatchNorm statistics random too) is written as each library's state dict with
our exporter, with our logits on random images. Then, in a separate Python that
has torch, timm and torchvision and not resnet_app, `timm.create_model` and the
torchvision constructor load each file with `load_state_dict(strict=True)` and
compute the same images' logits. With `--model_dir`, the run is exported by
`resnet-app export --format=timm,torchvision` and its whole evaluation split is
compared against the logits `resnet-app report` saved (predictions.npz); the
run must be fp32, on IDX data (read here by NumPy). Prints one JSON line per
file: the relative L2 difference of the logits, top-1 agreement, and both top-1s.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

# (architecture, libraries): torchvision's four, timm's variants.
ARCHITECTURES = (
    ("resnet18", ("timm", "torchvision")),
    ("resnet50", ("timm", "torchvision")),
    ("resnext50_32x4d", ("timm", "torchvision")),
    ("wide_resnet50_2", ("torchvision",)),
    ("resnet50d", ("timm",)),
    ("seresnext50_32x4d", ("timm",)),
    ("ecaresnet50d", ("timm",)),
    ("resnetrs50", ("timm",)),
)
IMAGES, SIZE, CLASSES = 8, 64, 10


def write_files(directory: str) -> list[dict]:
    """Each architecture's files and logits (project side)."""
    from safetensors.numpy import save_file

    from resnet_app.export import torch_weights
    from resnet_app.nets.resnet import create_model
    from resnet_app.pretrained import sources

    rng = np.random.default_rng(0)
    images = rng.normal(size=(IMAGES, SIZE, SIZE, 3)).astype(np.float32)
    np.save(os.path.join(directory, "images.npy"), images.transpose(0, 3, 1, 2))
    cases = []
    for name, libraries in ARCHITECTURES:
        model = create_model(name, num_classes=CLASSES, **sources.TORCHVISION_FIELDS)
        model.build((None, SIZE, SIZE, 3))
        for variable in model.weights:  # Random statistics too, so that BatchNorm counts.
            value = rng.normal(size=variable.shape) * 0.05
            if "variance" in variable.path or "gamma" in variable.path:
                value = 1.0 + np.abs(value)
            variable.assign(value.astype(np.float32))
        logits = os.path.join(directory, f"{name}_logits.npy")
        np.save(logits, model(images, training=False).numpy())
        path = os.path.join(directory, f"{name}.safetensors")
        save_file(torch_weights.state_dict(model), path)
        cases += [{"library": lib, "architecture": name, "file": path, "logits": logits,
                   "images": os.path.join(directory, "images.npy"), "num_classes": CLASSES,
                   "in_chans": 3} for lib in libraries]  # fmt: skip
    return cases


def run_cases(model_dir: str, directory: str) -> list[dict]:
    """The run exported to both libraries, with `report`'s logits of its evaluation split."""
    from resnet_app import config

    export = os.path.join(directory, "export")
    reports = os.path.join(directory, "reports")
    for argv in (
        ["resnet_app.export", f"--export_dir={export}", "--format=timm,torchvision"],
        ["resnet_app.report", f"--report_dir={reports}", "--top_losses=1"],
    ):
        done = subprocess.run([sys.executable, "-m", *argv, f"--model_dir={model_dir}"],
                              capture_output=True, text=True)  # fmt: skip
        if done.returncode:
            sys.exit(f"{argv[0]} failed: {done.stderr.strip().splitlines()[-1]}")
        record = json.loads(done.stdout.splitlines()[-1])
    run = config.read_run_config(model_dir)
    scheme, _, data = run.data.dataset.partition(":")
    if scheme != "idx" or run.train.precision != "fp32":
        sys.exit("--model_dir: give an fp32 run on IDX data (idx:DIR)")
    with np.load(os.path.join(record["report"], "predictions.npz")) as saved:
        order = np.argsort(saved["id"])
        logits = os.path.join(directory, "run_logits.npy")
        np.save(logits, saved["logits"][order])
    with gzip.open(os.path.join(data, "t10k-images-idx3-ubyte.gz")) as f:
        pixels = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 1, 28, 28)
    images = os.path.join(directory, "run_images.npy")
    np.save(images, pixels)
    with open(os.path.join(export, "model_info.json")) as f:
        info = json.load(f)
    return [{"library": lib, "architecture": info[lib]["architecture"],
             "file": os.path.join(export, info[lib]["file"]), "logits": logits,
             "images": images, "num_classes": info[lib]["num_classes"],
             "in_chans": info[lib]["in_chans"], "mean": info[lib]["mean"],
             "std": info[lib]["std"]} for lib in ("timm", "torchvision")]  # fmt: skip


def check(case: dict) -> dict:
    """The library's logits of the case's images against ours (torch side)."""
    import timm
    import torch
    import torchvision
    from safetensors.torch import load_file

    name, classes, channels = case["architecture"], case["num_classes"], case["in_chans"]
    if case["library"] == "timm":
        network = timm.create_model(name, num_classes=classes, in_chans=channels)
    else:
        network = getattr(torchvision.models, name)(num_classes=classes)
        if channels != 3:  # torchvision's constructors take RGB: its first convolution, anew.
            network.conv1 = torch.nn.Conv2d(channels, 64, 7, 2, 3, bias=False)
    network.load_state_dict(load_file(case["file"]), strict=True)
    network.eval()
    images = np.load(case["images"])
    if images.dtype == np.uint8:  # A run's images: normalized as the export's JSON says.
        mean, std = (np.asarray(case[k], np.float32)[:, None, None] for k in ("mean", "std"))
        images = (images.astype(np.float32) / 255 - mean) / std
    parts = np.array_split(images, max(1, len(images) // 500))
    with torch.no_grad():
        theirs = torch.cat([network(torch.from_numpy(part)) for part in parts]).numpy()
    ours = np.load(case["logits"])
    return {
        "library": case["library"],
        "architecture": name,
        "examples": len(ours),
        "relative_l2": float(np.linalg.norm(theirs - ours) / np.linalg.norm(ours)),
        "top1_agreement": float(np.mean(theirs.argmax(1) == ours.argmax(1))),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--torch_python", help="a Python with torch, timm and torchvision")
    parser.add_argument("--model_dir", help="also a trained fp32 run on IDX data")
    parser.add_argument("--check", help=argparse.SUPPRESS)  # Internal: the torch side.
    options = parser.parse_args()
    if options.check:
        with open(options.check) as f:
            for case in json.load(f):
                print(json.dumps(check(case)), flush=True)
        return
    if not options.torch_python:
        parser.error("--torch_python is required")
    with tempfile.TemporaryDirectory() as directory:
        cases = write_files(directory)
        if options.model_dir:
            cases += run_cases(options.model_dir, directory)
        listing = os.path.join(directory, "cases.json")
        with open(listing, "w") as f:
            json.dump(cases, f)
        done = subprocess.run([options.torch_python, __file__, f"--check={listing}"])
        sys.exit(done.returncode)


if __name__ == "__main__":
    main()
