"""The no-traceback matrix (tests/matrix.py) on the built-in kinds, TFRecords and tfds offline."""

import pytest

from tests import matrix

pytestmark = pytest.mark.integration  # Subprocesses and training runs.

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


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    root = tmp_path_factory.mktemp("matrix")
    return root, matrix.make_datasets(root)


@pytest.mark.parametrize("kind", list(EXPECTED_REFUSALS))
def test_every_command_works_or_refuses_in_one_line(kind, datasets):
    root, names = datasets
    matrix.check(matrix.run_kind(kind, names[kind], root), EXPECTED_REFUSALS[kind])
