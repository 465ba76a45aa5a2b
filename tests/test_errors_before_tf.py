"""Mistakes that need no TensorFlow are answered before it loads, in one line.

Each command runs with a `tensorflow` package first on the path that raises
when imported: a mistake found before the import still gets its one line,
one found after it would end in that ImportError instead. (No timed test:
`scripts/error_timing.py` at commit d94b0ee measured the seconds.)
"""

import os

import pytest

from resnet_app.data.sources import tfds_source
from tests.commands import REPO, blocked_packages, error_line, run_command
from tests.tfds_mock import closed_port

MISTAKES = [
    (["--batch_sise=64"], "Did you mean: batch_size"),
    (["--set", "data.augment.augmix_jsd=12"], "data.augment.augmix_jsd is AugMix's and"),
    (["--set", "train.bogus=1"], "unknown train key(s) bogus"),
    (["--config=cifar10_resnet57"], "config file cifar10_resnet57 not found"),
    (["--model=resnet51"], "unknown model 'resnet51'"),
    (["--dataset=cifar11"], "unknown dataset 'cifar11' (did you mean cifar10_1 or cifar10"),
    (["--dataset=cifar10"], "is not prepared in {tfds} and there is no network"),
    (["--dataset=imagenette2/320px-v2"], "unknown dataset 'imagenette2/320px-v2'"),
    (["--dataset=imagenet2012"], "put its files in {tfds}/downloads/manual"),
    (["--dataset=folder:{tmp}/nowhere"], "{tmp}/nowhere is not a directory"),
    (["--dataset=folder:{tmp}"], "no train/ in {tmp}"),
    (["--dataset=csv:{tmp}/table.csv"], "{tmp}/table.csv is not a file"),
    (["--dataset=tfrecord:{tmp}"], "no train-* shards in {tmp}"),
    (["--dataset=idx:{tmp}"], "no train-images-idx3-ubyte (or .gz) in {tmp}"),
    (["--init_from={tmp}/weights.h5"], "train.init_from={tmp}/weights.h5: no such file"),
    (["--init_from=keras:resnet51"], "unknown Keras applications model"),
    (["--init_from={tmp}/nowhere"], "no such file or directory"),
    (["--set=train.teacher={tmp}/nowhere"], "train.teacher={tmp}/nowhere: no such file or dir"),
    (["--set=train.teacher={tmp}/teacher.safetensors"], "name its network with train.teacher_m"),
    (["--config={tmp}/empty.yaml"], "config file {tmp}/empty.yaml is empty; give it sections"),
    (["--config={tmp}/twice.yaml"], "'train' appears twice (lines 1 and 3); keep one and merge"),
]


@pytest.fixture
def no_tensorflow(tmp_path):
    """A PYTHONPATH on which `import tensorflow` raises."""
    return f"{blocked_packages(tmp_path / 'blocked', 'tensorflow')}{os.pathsep}{REPO}"


@pytest.mark.parametrize("args, message", MISTAKES, ids=[" ".join(a) for a, _ in MISTAKES])
def test_train_mistakes_before_tensorflow(args, message, tmp_path, no_tensorflow):
    work = tmp_path / "work"
    work.mkdir()
    tfds = tmp_path / "tfds"
    env = {
        "PYTHONPATH": no_tensorflow,
        tfds_source.NETWORK_PROBE_ENV: closed_port(),
        "TFDS_DATA_DIR": str(tfds),
    }
    args = [a.format(tmp=work) for a in args]
    (work / "empty.yaml").write_text("# Nothing yet.\n")
    (work / "teacher.safetensors").write_bytes(b"")
    (work / "twice.yaml").write_text(
        "train: {epochs: 3}\nmodel: {name: tiny}\ntrain: {batch_size: 8}\n"
    )
    line = error_line(run_command("resnet_app.train", *args, env=env))
    assert message.format(tmp=work, tfds=tfds) in line


def test_tools_check_the_dataset_before_tensorflow(tmp_path, no_tensorflow):
    for tool in ("resnet_app.tools.show_batch", "resnet_app.tools.lr_find"):
        result = run_command(
            tool, f"--dataset=folder:{tmp_path}/x", env={"PYTHONPATH": no_tensorflow}
        )
        assert f"{tmp_path}/x is not a directory" in error_line(result)


def test_export_format_before_tensorflow(tmp_path, no_tensorflow):
    result = run_command(
        "resnet_app.export",
        f"--model_dir={tmp_path}",
        f"--export_dir={tmp_path}/out",
        "--format=onnxx",
        env={"PYTHONPATH": no_tensorflow},
    )
    assert "--format=onnxx: use one of saved_model" in error_line(result)


def test_a_prepared_or_manual_dataset_is_left_to_tfds(tmp_path, monkeypatch):
    """Offline, a dataset already in the data directory (or its manual files) is no mistake."""
    monkeypatch.setenv(tfds_source.NETWORK_PROBE_ENV, closed_port())

    class Data:
        data_dir = str(tmp_path)
        coarse_labels = False

    (tmp_path / "cifar10" / "3.0.2").mkdir(parents=True)
    (tmp_path / "cifar10" / "3.0.2" / "dataset_info.json").write_text("{}")  # As tfds leaves it.
    tfds_source.check("cifar10", Data)
    tfds_source.check("cifar10:3.0.2", Data)
    tfds_source.check("huggingface:mnist", Data)  # A community name: tfds decides.
    with pytest.raises(Exception, match="no network"):
        tfds_source.check("imagenet2012", Data)
    (tmp_path / "downloads" / "manual").mkdir(parents=True)
    (tmp_path / "downloads" / "manual" / "ILSVRC2012_img_train.tar").write_bytes(b"")
    tfds_source.check("imagenet2012", Data)


def test_every_tfds_builder_is_a_known_name():
    """The name list read from tfds's files covers tfds's own list: no good name is refused."""
    import tensorflow_datasets as tfds

    builders = tfds.list_builders(with_community_datasets=False)
    assert len(builders) > 100
    assert set(builders) <= tfds_source.known_names()
    assert "cifar11" not in tfds_source.known_names()
