"""Breaks the code on purpose, one place at a time, and shows the suite catch it.

    python scripts/break_on_purpose.py            # every breakage
    python scripts/break_on_purpose.py 2 5        # the 2nd and the 5th

Each breakage changes its file, runs its target test files in the default tier,
prints one JSON line {n, what, file, targets, failed, summary, seconds} and puts
the file back (also on Ctrl-C). A breakage whose tests all pass is a hole in the suite.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import re
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent


@dataclasses.dataclass(frozen=True)
class Breakage:
    what: str
    path: str  # Relative to the repository.
    old: str  # Found exactly once in `path`.
    new: str
    targets: tuple[str, ...]  # Test files that must fail.


BREAKAGES = (
    Breakage(
        "a tower's gradient not averaged (each tower divides by its own examples)",
        "resnet_app/engine/sync.py",
        "return tf.distribute.get_replica_context().all_reduce(SUM, tf.reduce_sum(mask))",
        "return tf.reduce_sum(mask)",
        ("tests/test_step.py",),
    ),
    Breakage(
        "a resume one step off (the stream re-entered a batch later)",
        "resnet_app/engine/setup.py",
        "start_example = int(self.data_position.numpy())\n",
        "start_example = int(self.data_position.numpy())\n"
        "        start_example += global_batch if start_example else 0\n",
        ("tests/test_train.py", "tests/test_checkpoint.py"),
    ),
    Breakage(
        "an evaluation's padding counted as examples",
        "resnet_app/engine/exact_eval.py",
        '"examples": tf.reduce_sum(mask),',
        '"examples": tf.reduce_sum(tf.ones_like(mask)),',
        ("tests/test_evaluation.py",),
    ),
    Breakage(
        "a file written in place, not through a synced temporary file and a rename",
        "resnet_app/common/files.py",
        "        write(temporary)\n"
        "        sync_file(temporary)\n"
        "        os.replace(temporary, path)\n",
        "        write(path)\n",
        ("tests/test_durable.py",),
    ),
    Breakage(
        "a checkpoint not synced before the older ones are rotated out",
        "resnet_app/common/checkpoint.py",
        "callbacks = [make_durable] if self._durable else None",
        "callbacks = None",
        ("tests/test_durable.py",),
    ),
    Breakage(
        "a bottleneck's stride on the wrong convolution",
        "resnet_app/nets/blocks.py",
        "stride_1x1, stride_3x3 = (stride, 1) if config.stride_in_1x1 else (1, stride)",
        "stride_1x1, stride_3x3 = (1, stride) if config.stride_in_1x1 else (stride, 1)",
        ("tests/test_model.py",),
    ),
    Breakage(
        "a TFRecord label offset off by one",
        "resnet_app/data/sources/tfrecord.py",
        "label = features[self.label_key] - self.label_offset",
        "label = features[self.label_key] - self.label_offset + 1",
        ("tests/test_tfrecord.py",),
    ),
    Breakage(
        "TFLite and ONNX exports normalized without the std",
        "resnet_app/export/portable.py",
        "pixels = (pixels - mean) / std",
        "pixels = pixels - mean",
        ("tests/test_export_formats.py",),
    ),
    Breakage(
        "the run's lock never released",
        "resnet_app/common/run_lock.py",
        "                os.close(self._fd)  # Closing the descriptor unlocks it.\n",
        "                pass\n",
        ("tests/test_run_lock.py",),
    ),
    Breakage(
        "weight decay twice TF1's (Keras's L2 without the half)",
        "resnet_app/nets/layers.py",
        "keras.regularizers.L2(weight_decay / 2)",
        "keras.regularizers.L2(weight_decay)",
        ("tests/test_model.py",),
    ),
    Breakage(
        "model averaging one step after its interval",
        "resnet_app/engine/local_sgd.py",
        "return tf.equal(step % tf.cast(self.interval, step.dtype), 0)",
        "return tf.equal(step % tf.cast(self.interval, step.dtype), 1)",
        ("tests/test_averaging.py",),
    ),
    Breakage(
        "a resumed run's teacher read from its source, not from the run's copy",
        "resnet_app/engine/teacher.py",
        "from_copy = resuming and os.path.isfile(os.path.join(copy, INFO))",
        "from_copy = False",
        ("tests/test_distill.py",),
    ),
    Breakage(
        "the distillation loss without its T^2",
        "resnet_app/engine/losses/distillation.py",
        "return loss * temperature**2",
        "return loss",
        ("tests/test_distill.py",),
    ),
    Breakage(
        "AugMix's views sharing the plain view's stochastic depth",
        "resnet_app/engine/losses/consistency.py",
        "copies = tf.concat([copy * VIEWS + view for view in range(VIEWS)], axis=0)",
        "copies = tf.concat([copy * VIEWS for view in range(VIEWS)], axis=0)",
        ("tests/test_augmix.py",),
    ),
    Breakage(
        "AugMix's mix weighing the image by a chain's weight",
        "resnet_app/data/augmix.py",
        "mixed = weights[:, 0] * tf.cast(images, tf.float32)",
        "mixed = weights[:, 1] * tf.cast(images, tf.float32)",
        ("tests/test_augmix.py",),
    ),
)


def run(number: int, breakage: Breakage) -> dict:
    """Applies `breakage`, runs its targets, puts the source back; the record."""
    source = ROOT / breakage.path
    original = source.read_text()
    if original.count(breakage.old) != 1:
        raise SystemExit(f"error: breakage {number}: its text is not once in {breakage.path}")
    source.write_text(original.replace(breakage.old, breakage.new))
    started = time.monotonic()
    try:
        command = [sys.executable, "-m", "pytest", "-q", "-rf", "-p", "no:cacheprovider"]
        result = subprocess.run(
            [*command, *breakage.targets], cwd=ROOT, capture_output=True, text=True
        )
    finally:
        source.write_text(original)
    lines = result.stdout.splitlines()
    return {
        "n": number,
        "what": breakage.what,
        "file": breakage.path,
        "targets": list(breakage.targets),
        "failed": sorted(set(re.findall(r"^FAILED (\S+)", result.stdout, re.M))),
        "summary": next(
            (line for line in reversed(lines) if " passed" in line or " failed" in line), ""
        ),
        "seconds": round(time.monotonic() - started),
    }


def main(argv: list[str]) -> int:
    valid = range(1, len(BREAKAGES) + 1)
    wrong = [arg for arg in argv if not (arg.isdigit() and int(arg) in valid)]
    if wrong:
        print(
            f"error: {wrong[0]} is not a breakage's number; give numbers from 1 to "
            f"{len(BREAKAGES)}, or none for all (see the list at the top of {__file__})",
            file=sys.stderr,
        )
        return 2
    chosen = [int(arg) for arg in argv] or valid
    missed = 0
    for number in chosen:
        record = run(number, BREAKAGES[number - 1])
        missed += not record["failed"]
        print(json.dumps(record), flush=True)
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
