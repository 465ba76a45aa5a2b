"""The no-traceback matrix (tests/matrix.py) on the built-in kinds, TFRecords and tfds offline."""

import pytest

from tests import matrix

UNKNOWN_SIZE = "is not known here; pass --examples_per_epoch=N"
OFFLINE = "is not prepared in"
EXPECTED_REFUSALS = {
    "shapes": {},
    "synthetic": {"export": "--quantize=int8 needs the run's training"},
    "tfrecord": {"schedule": UNKNOWN_SIZE},
    "tfds (offline)": {
        "train": OFFLINE,
        "show-batch": OFFLINE,
        "lr-find": OFFLINE,
        "launch": OFFLINE,
    },
}


@pytest.mark.parametrize("kind", list(EXPECTED_REFUSALS))
def test_every_command_works_or_refuses_in_one_line(kind, matrix_datasets):
    root, names = matrix_datasets
    matrix.check(matrix.run_kind(kind, names[kind], root), EXPECTED_REFUSALS[kind])
