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


def test_every_registered_source_kind_has_its_cells(matrix_datasets):
    """The registry is the gate: a source kind registered without a row in the
    matrix (here or in test_matrix_own_data.py) fails here."""
    from resnet_app.data.sources import registry
    from tests import test_matrix_own_data

    _, names = matrix_datasets
    schemes = set()
    for kind in {*EXPECTED_REFUSALS, *test_matrix_own_data.EXPECTED_REFUSALS}:
        source, _ = registry.parse(names[kind])
        schemes.add(names[kind] if source is None else source.scheme)
    assert schemes == {*registry.scheme_names(), registry.TFDS_SCHEME}
