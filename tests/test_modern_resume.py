"""The modern recipe's pieces, all on, survive a SIGKILL bitwise (the driver of test_checkpoint)."""

import random
import signal

import numpy as np
import pytest

from resnet_app.common import checkpoint
from tests.runs import saved_tensors
from tests.test_checkpoint import SMALL, drive

pytestmark = pytest.mark.integration  # Training subprocesses.

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
    kill_at = random.Random().randint(6, 9)
    whole = drive(*args, f"--model_dir={tmp_path / 'whole'}")
    assert whole.returncode == 0, whole.stderr[-3000:]
    killed = drive(*args, f"--model_dir={tmp_path / 'run'}", kill_at=kill_at)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert 5 in [s for s, _ in checkpoint.list_checkpoints(str(tmp_path / "run"))]
    resumed = drive(*args, f"--model_dir={tmp_path / 'run'}")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    expected = saved_tensors(tmp_path / "whole" / "ckpt-12")
    actual = saved_tensors(tmp_path / "run" / "ckpt-12")
    assert set(actual) == set(expected)
    assert any(name.startswith("ema/") for name in expected)  # The average is compared too.
    for name, value in expected.items():
        np.testing.assert_array_equal(actual[name], value, err_msg=f"{name} (killed at {kill_at})")
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
