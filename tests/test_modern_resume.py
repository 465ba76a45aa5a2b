"""The modern recipe's pieces, all on, survive a SIGKILL bitwise (the driver of test_checkpoint)."""

import signal

import numpy as np

from resnet_app.common import checkpoint
from tests import runs
from tests.runs import saved_tensors
from tests.test_checkpoint import SMALL, drive

MODERN = [
    "--set=model.drop_path_rate=0.3",
    "--set=train.accumulate_steps=2",
    "--set=train.loss=bce",
    "--set=train.bce_target_threshold=0.2",
    "--set=train.label_smoothing=0.1",
    "--set=train.keep_best=true",
    "--set=optimizer.class=lamb",
    "--set=optimizer.learning_rate=0.01",
    "--set=optimizer.weight_decay=0.02",
    "--set=data.mixup_alpha=0.2",
    "--set=data.cutmix_alpha=1.0",
    "--set=data.mix_mode=example",
    "--set=data.randaugment_ops=2",
    "--set=data.erase_probability=0.25",
    "--set=train.ema_decay=0.9",
    "--set=train.ema_warmup=true",
]


def test_sigkill_with_every_modern_piece_on_resumes_bitwise(tmp_path):
    args = [*SMALL, *MODERN, f"--data_dir={tmp_path / 'data'}", "--train_steps=12"]
    args += ["--deterministic", "--set=train.checkpoint_every=5", "--eval_every=4"]
    kill_at = runs.fault_rng().randint(6, 9)
    whole = drive(*args, f"--model_dir={tmp_path / 'whole'}")
    assert whole.returncode == 0, whole.stderr[-3000:]
    killed = drive(*args, f"--model_dir={tmp_path / 'run'}", kill_at=kill_at)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert 5 in [s for s, _ in checkpoint.list_checkpoints(str(tmp_path / "run"))]
    resumed = drive(*args, f"--model_dir={tmp_path / 'run'}")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    expected = runs.assert_same_checkpoints(
        tmp_path / "whole" / "ckpt-12", tmp_path / "run" / "ckpt-12", f"(killed at {kill_at})"
    )
    assert any(name.startswith("ema/") for name in expected)  # The average is compared too.
    # The control: the pieces change the run (another drop rate, other weights).
    other = drive(
        *[a for a in args if "drop_path_rate" not in a],
        "--set=model.drop_path_rate=0.1",
        f"--model_dir={tmp_path / 'other'}",
    )
    assert other.returncode == 0, other.stderr[-3000:]
    different = saved_tensors(tmp_path / "other" / "ckpt-12")
    assert any(
        not np.array_equal(different[name], value)
        for name, value in expected.items()
        if name.startswith("model/")
    )


# The family's layers in the tiny network (test_export_formats.FAMILY as flags):
# grouped convs, SE, a deep stem with the strided-conv pool, the average-pool
# shortcut and dropout, whose draws are keyed like stochastic depth's.
FAMILY = [
    "--set=model.block=bottleneck",
    "--set=model.units=[1, 1]",
    "--set=model.widths=[8, 8]",
    "--set=model.strides=[1, 2]",
    "--set=model.groups=4",
    "--set=model.base_width=16",
    "--set=model.attention=se",
    "--set=model.se_ratio=0.5",
    "--set=model.stem=deep",
    "--set=model.stem_filters=8",
    "--set=model.init_max_pool=true",
    "--set=model.replace_stem_pool=true",
    "--set=model.shortcut=avg_projection",
    "--set=model.dropout=0.2",
]


def test_sigkill_of_a_family_network_resumes_bitwise(tmp_path):
    args = [*SMALL, *FAMILY, f"--data_dir={tmp_path / 'data'}", "--train_steps=10"]
    args += ["--deterministic", "--set=train.checkpoint_every=4"]
    kill_at = runs.fault_rng().randint(5, 7)
    whole = drive(*args, f"--model_dir={tmp_path / 'whole'}")
    assert whole.returncode == 0, whole.stderr[-3000:]
    killed = drive(*args, f"--model_dir={tmp_path / 'run'}", kill_at=kill_at)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    resumed = drive(*args, f"--model_dir={tmp_path / 'run'}")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    expected = runs.assert_same_checkpoints(
        tmp_path / "whole" / "ckpt-10", tmp_path / "run" / "ckpt-10", f"(killed at {kill_at})"
    )
    # The family's variables are in the comparison (trainable ones are keyed by
    # the optimizer's list, so found by shape): the SE reduction (32 -> 16)
    # and the grouped 3x3 kernel (4 groups of 2 inputs, 8 outputs).
    shapes = {np.shape(value) for value in expected.values()}
    assert {(32, 16), (3, 3, 2, 8)} <= shapes
    # The control: dropout's draws move the weights (another rate, other weights).
    other = drive(
        *[a for a in args if "dropout" not in a],
        "--set=model.dropout=0.1",
        f"--model_dir={tmp_path / 'other'}",
    )
    assert other.returncode == 0, other.stderr[-3000:]
    different = saved_tensors(tmp_path / "other" / "ckpt-10")
    assert any(
        not np.array_equal(different[name], value)
        for name, value in expected.items()
        if name.startswith("model/")
    )
