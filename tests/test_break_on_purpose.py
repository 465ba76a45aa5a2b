"""scripts/break_on_purpose.py stays runnable: each breakage's text is in its file once."""

import importlib.util
import os
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _script():
    path = os.path.join(REPO, "scripts", "break_on_purpose.py")
    spec = importlib.util.spec_from_file_location("break_on_purpose", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up.
    spec.loader.exec_module(module)
    return module


BREAKAGES = _script().BREAKAGES


@pytest.mark.parametrize("breakage", BREAKAGES, ids=[b.path for b in BREAKAGES])
def test_each_breakage_changes_one_place_and_names_existing_tests(breakage):
    with open(os.path.join(REPO, breakage.path)) as f:
        assert f.read().count(breakage.old) == 1, breakage.what
    assert breakage.new != breakage.old
    for target in breakage.targets:
        assert os.path.exists(os.path.join(REPO, target)), target


def test_there_are_at_least_eight_in_different_places():
    assert len(BREAKAGES) >= 8
    assert len({(b.path, b.old) for b in BREAKAGES}) == len(BREAKAGES)
