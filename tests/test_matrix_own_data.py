"""The no-traceback matrix (tests/matrix.py) on own data: folder, CSV, IDX, CIFAR, Hugging Face."""

import pytest

from tests import matrix

UNKNOWN_SIZE = "is not known here; pass --examples_per_epoch=N"
EXPECTED_REFUSALS = {
    "folder": {"schedule": UNKNOWN_SIZE},
    "csv": {"schedule": UNKNOWN_SIZE},
    "multi-label csv": {"schedule": UNKNOWN_SIZE},
    "idx": {"schedule": UNKNOWN_SIZE},
    "cifar": {"schedule": UNKNOWN_SIZE},
    "hf": {"schedule": UNKNOWN_SIZE},
}


@pytest.mark.parametrize("kind", list(EXPECTED_REFUSALS))
def test_every_command_works_or_refuses_in_one_line(kind, matrix_datasets):
    root, names = matrix_datasets
    matrix.check(matrix.run_kind(kind, names[kind], root), EXPECTED_REFUSALS[kind])
