"""A data source of the user's own (tests/toy_source.py), added as a plugin with no
other edit: listed, parsed, loaded, and run through every command by the
no-traceback matrix (tests/matrix.py) from the example it writes."""

import sys

import numpy as np
import pytest

from resnet_app.common.errors import ConfigError
from resnet_app.data import shapes
from resnet_app.data.sources import registry
from tests import matrix

PLUGIN = {registry.PLUGIN_VARIABLE: "tests.toy_source"}


@pytest.fixture
def plugin_registry(monkeypatch):
    """The registry as a shell with the plugin named sees it; restored after the test."""
    monkeypatch.setattr(registry, "_KINDS", dict(registry._KINDS))
    monkeypatch.setattr(registry, "_plugins_read", set())
    monkeypatch.delitem(sys.modules, "tests.toy_source", raising=False)  # Imported afresh.
    monkeypatch.setenv(registry.PLUGIN_VARIABLE, PLUGIN[registry.PLUGIN_VARIABLE])
    return registry


def test_the_plugin_is_listed_parsed_and_loaded(plugin_registry, tmp_path):
    assert "arrays" in plugin_registry.scheme_names()
    assert "arrays:FILE.npz" in plugin_registry.usages()
    images, labels = shapes.generate("train", 10, seed=1)
    splits = ["train"] * 6 + ["test"] * 4
    kind = plugin_registry.kinds()["arrays"]
    dataset = kind.example(str(tmp_path), images, labels, splits)
    source = plugin_registry.load_source(type("Config", (), {"dataset": dataset})())
    np.testing.assert_array_equal(source.split("train").images, images[:6])
    np.testing.assert_array_equal(source.split("test").labels, labels[6:])
    assert source.image_size == images.shape[1]


def test_a_plugin_that_cannot_be_imported_is_one_line(plugin_registry, monkeypatch):
    monkeypatch.setenv(registry.PLUGIN_VARIABLE, "tests.toy_source, no_such_plugin_module")
    with pytest.raises(ConfigError) as error:
        plugin_registry.parse("arrays:x.npz")
    message = str(error.value)
    assert "'no_such_plugin_module'" in message and registry.PLUGIN_VARIABLE in message
    assert "ModuleNotFoundError" in message and "\n" not in message


def test_without_the_plugin_named_the_scheme_is_a_tfds_name(monkeypatch):
    monkeypatch.delenv(registry.PLUGIN_VARIABLE, raising=False)
    kind, argument = registry.parse("arrays:x.npz")
    assert kind.scheme == registry.TFDS_SCHEME and argument == "arrays:x.npz"


def test_the_matrix_runs_every_command_on_the_plugins_example(plugin_registry, matrix_datasets):
    root, _ = matrix_datasets
    images, labels = shapes.generate("train", 48, seed=3)
    (root / "plugin").mkdir(exist_ok=True)
    dataset = plugin_registry.kinds()["arrays"].example(
        str(root / "plugin"), images, labels, ["train"] * 36 + ["test"] * 12
    )
    cells = matrix.run_kind("arrays plugin", dataset, root, env=PLUGIN)
    matrix.check(cells, {"schedule": "is not known here; pass --examples_per_epoch=N"})


def test_an_installed_entry_point_is_read_like_the_variable(plugin_registry, monkeypatch):
    import importlib.metadata

    monkeypatch.delenv(registry.PLUGIN_VARIABLE)
    point = importlib.metadata.EntryPoint("arrays", "tests.toy_source", registry.PLUGIN_GROUP)

    def entry_points(group):
        return [point] if group == registry.PLUGIN_GROUP else []

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)
    monkeypatch.setattr(registry, "_entry_points", [])  # Scanned again, with the fake.
    assert registry.parse("arrays:x.npz")[0].scheme == "arrays"
