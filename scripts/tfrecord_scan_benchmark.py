"""How long `--dataset=tfrecord:DIR` takes to start: the first scan against the cached index.

  python scripts/tfrecord_scan_benchmark.py [--shards=256] [--records=1000] [--image_kb=110]

Writes `--shards` train shards of `--records` records each, in the layout of
build_imagenet_data.py, every record a random payload of about `--image_kb`
KB under `image/encoded` (ImageNet's training JPEGs average about 110 KB) with
an int64 label and a class text; then loads the source twice, each time in a
fresh process: the first scans every record (`sources/record_index.py`), the
second reads the cached index. Prints both times, the scan's rate in records
and megabytes per second, and their ratio, with the CPU flags (compare ratios
across machines, never absolute numbers). Needs --shards x --records x
--image_kb of free disk (28 GB for the defaults; ImageNet's 1,281,167 images
are 1,024 shards of 1,251).
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from absl import flags, logging

from resnet_app.common import cli
from resnet_app.common.errors import ConfigError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_SHARDS = flags.DEFINE_integer("shards", 256, "Train shards to write.")
_RECORDS = flags.DEFINE_integer("records", 1000, "Records per shard.")
_IMAGE_KB = flags.DEFINE_integer("image_kb", 110, "Bytes of each record's image, in KB.")
_WORK_DIR = flags.DEFINE_string("work_dir", None, "Where the shards go (default: a temp dir).")

LOAD = """
import sys, time
started = time.monotonic()
from resnet_app.data.settings import data_config
from resnet_app.data.sources import tfrecord
source = tfrecord.load(
    sys.argv[1], data_config(data_dir=sys.argv[2], records={"label_offset": 1})
)
print(time.monotonic() - started, source.split("train").num_examples)
"""


def write_shards(root: str, shards: int, records: int, size: int) -> int:
    """The shards, written once (a finished set is reused); returns their bytes."""
    import numpy as np
    import tensorflow as tf

    os.makedirs(root, exist_ok=True)
    rng = np.random.default_rng(0)
    payload = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
    for shard in range(shards):
        path = os.path.join(root, f"train-{shard:05d}-of-{shards:05d}")
        if os.path.exists(path):
            continue
        with tf.io.TFRecordWriter(path + ".tmp") as writer:
            for i in range(records):
                label = int(rng.integers(1, 1001))
                feature = {
                    "image/encoded": tf.train.Feature(
                        bytes_list=tf.train.BytesList(value=[payload[i % 97 :] + payload[: i % 97]])
                    ),
                    "image/class/label": tf.train.Feature(
                        int64_list=tf.train.Int64List(value=[label])
                    ),
                    "image/class/text": tf.train.Feature(
                        bytes_list=tf.train.BytesList(value=[f"class {label}".encode()])
                    ),
                }
                example = tf.train.Example(features=tf.train.Features(feature=feature))
                writer.write(example.SerializeToString())
        os.replace(path + ".tmp", path)
    return sum(os.path.getsize(os.path.join(root, name)) for name in os.listdir(root))


def load_seconds(root: str, cache: str) -> tuple[float, int]:
    result = subprocess.run(
        [sys.executable, "-c", LOAD, root, cache],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": REPO, "TF_CPP_MIN_LOG_LEVEL": "2"},
        check=False,
    )
    if result.returncode:
        raise ConfigError(f"loading the shards failed: {result.stderr.strip().splitlines()[-1]}")
    seconds, count = result.stdout.split()
    return float(seconds), int(count)


def main(argv: list[str]) -> None:
    cli.reject_positional(argv)
    for name, value in (("--shards", _SHARDS), ("--records", _RECORDS), ("--image_kb", _IMAGE_KB)):
        if value.value < 1:
            raise ConfigError(f"{name} must be 1 or more")
    from resnet_app.common import hardware

    work = _WORK_DIR.value or tempfile.mkdtemp(prefix="tfrecord_scan_")
    root, cache = os.path.join(work, "shards"), os.path.join(work, "cache")
    shutil.rmtree(cache, ignore_errors=True)
    written = time.monotonic()
    size = write_shards(root, _SHARDS.value, _RECORDS.value, _IMAGE_KB.value << 10)
    logging.info("Shards ready in %.0f s: %.1f GB", time.monotonic() - written, size / 1e9)
    first, count = load_seconds(root, cache)
    second, _ = load_seconds(root, cache)
    report = {
        "cpu": hardware.read_cpu_info().describe(),
        "shards": _SHARDS.value,
        "records": count,
        "gigabytes": round(size / 1e9, 2),
        "first_load_s": round(first, 1),
        "cached_load_s": round(second, 1),
        "scan_records_per_s": round(count / first),
        "scan_mb_per_s": round(size / 1e6 / first),
        "ratio": round(first / second, 1),
    }
    sys.stdout.write(json.dumps(report) + "\n")


if __name__ == "__main__":
    cli.run(main)
