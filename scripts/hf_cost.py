"""`benchmark.py hf`: a recipe on IDX files against the same images as a Hub Parquet repository.

Fashion-MNIST's IDX files are written with the `datasets` library as the Hub lays a dataset
out (`data/train-0000i-of-00002.parquet`, `data/test-00000-of-00001.parquet`: PNG images,
a ClassLabel); then per seed `resnet-app train --config=RECIPE` runs on `idx:` and on `hf:`,
the order alternating seed by seed. Reported: each run's final top-1 and its launch-to-exit
time, and the ratio of the medians.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import timing
from timing import median

KINDS = ("idx", "hf")


def idx_source(idx_dir: str):
    """The IDX files in `idx_dir` as the idx: source reads them (classes included)."""
    from resnet_app.data.settings import data_config
    from resnet_app.data.sources import load_source

    return load_source(data_config(dataset=f"idx:{idx_dir}"))


def write_hub(idx_dir: str, root: str) -> str:
    """The IDX files in `idx_dir` (`idx_source`) written as a Hub repository in `root`
    (two train shards, one test)."""
    from datasets import ClassLabel, Dataset, Features, Image

    source = idx_source(idx_dir)
    features = Features({"image": Image(), "label": ClassLabel(names=source.class_names)})
    os.makedirs(os.path.join(root, "data"), exist_ok=True)
    for split, shards in (("train", 2), ("test", 1)):
        images, labels = source.splits[split].images[..., 0], source.splits[split].labels
        data = Dataset.from_dict({"image": list(images), "label": labels.tolist()}, features)
        for i in range(shards):
            name = f"{split}-{i:05d}-of-{shards:05d}.parquet"
            data.shard(shards, i, contiguous=True).to_parquet(os.path.join(root, "data", name))
    return root


def write_folders(idx_dir: str, root: str) -> str:
    """The IDX files in `idx_dir` as PNG class folders, `root/<split>/<class>/<i>.png` (the
    folder race of docs/performance.md); a "/" in a class name becomes "-"."""
    import tensorflow as tf

    source = idx_source(idx_dir)
    for split in ("train", "test"):
        images, labels = source.splits[split].images, source.splits[split].labels
        for i, (image, label) in enumerate(zip(images, labels)):
            folder = os.path.join(root, split, source.class_names[label].replace("/", "-"))
            os.makedirs(folder, exist_ok=True)
            tf.io.write_file(os.path.join(folder, f"{i:05d}.png"), tf.io.encode_png(image))
    return root


def train(kind: str, seed: int, options: dict, work: str) -> dict:
    dataset = {"idx": f"idx:{options['idx_dir']}", "hf": f"hf:{options['hub_dir']}"}[kind]
    run_dir = os.path.join(work, f"{kind}_{seed}")
    argv = [sys.executable, "-m", "resnet_app.train", f"--config={options['config']}"]
    argv += [f"--dataset={dataset}", f"--seed={seed}", f"--model_dir={run_dir}", "--restart"]
    start = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, cwd=timing.REPO)
    seconds = time.perf_counter() - start
    if done.returncode:
        timing.fail(f"{kind} seed {seed} failed: {done.stderr.strip().splitlines()[-1]}")
    records = timing.read_records(os.path.join(run_dir, "metrics.jsonl"))
    top1 = [r["top1"] for r in records if "top1" in r][-1]
    return {"seconds": seconds, "top1": top1}


def hf(options: dict) -> dict:
    work = options["work_dir"] or tempfile.mkdtemp(prefix="hf_cost_")
    hub = os.path.join(work, "fashion_mnist_hub")
    if not os.path.isdir(os.path.join(hub, "data")):
        write_hub(options["idx_dir"], hub)
    options = {**options, "hub_dir": hub}
    runs = {kind: [] for kind in KINDS}
    for number, seed in enumerate(options["seeds"]):
        for kind in KINDS[::-1] if number % 2 else KINDS:
            runs[kind].append({"seed": seed, **train(kind, seed, options, work)})
    return {"cpu": timing.cpu().to_dict(), "config": options["config"], "runs": runs}


def text(result: dict) -> str:
    rows = [
        [kind, r["seed"], f"{100 * r['top1']:.2f}", f"{r['seconds']:.0f}"]
        for kind, runs in result["runs"].items()
        for r in runs
    ]
    idx, hub = (median(r["seconds"] for r in result["runs"][k]) for k in KINDS)
    means = {k: np.mean([r["top1"] for r in result["runs"][k]]) * 100 for k in KINDS}
    return (
        f"{timing.cpu_line(result['cpu'])}\n--config={result['config']}\n\n"
        f"{timing.markdown_table(['dataset', 'seed', 'top-1 (%)', 'launch to exit (s)'], rows)}\n\n"
        f"hf / idx, median times: {hub / idx:.3f} ({hub:.0f} s / {idx:.0f} s); mean top-1 "
        f"idx {means['idx']:.2f}%, hf {means['hf']:.2f}%"
    )


def add_parser(commands) -> None:
    sub = commands.add_parser("hf", help="a recipe on IDX files against the same data via hf:")
    sub.add_argument("--config", default="fashion_mnist_fast", help="the recipe")
    sub.add_argument("--idx_dir", default="/usr/share/datasets/fashion-mnist")
    sub.add_argument("--seeds", type=lambda s: [int(x) for x in s.split(",")], default=[0, 1, 2])
    sub.add_argument("--work_dir", help="where the runs and the Hub copy go (default: a temp)")
    sub.add_argument("--json", action="store_true", help="one JSON object, not a table")
    sub.set_defaults(rounds=1)
