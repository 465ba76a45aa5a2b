"""`resnet-app schedule` (`tools/lr_schedule.py`): the dry run prints and saves the schedule."""

import csv

from tests.commands import run_command


def lr_schedule(*args):
    return run_command("resnet_app.tools.lr_schedule", *args)


def test_cifar_recipe_to_csv_and_png(tmp_path):
    out, picture = tmp_path / "lr.csv", tmp_path / "lr.png"
    result = lr_schedule(
        "--config=configs/cifar10_resnet20.yaml", f"--csv={out}", f"--plot={picture}"
    )
    assert result.returncode == 0, result.stderr
    assert "64000 steps, 390 per epoch" in result.stdout
    with open(out) as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 64_000
    # He et al.: 0.1, /10 at 32k and at 48k iterations.
    for step, expected in [(0, 0.1), (31_999, 0.1), (32_000, 0.01), (48_000, 0.001)]:
        assert abs(float(rows[step]["learning_rate"]) - expected) < 1e-12
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_script_schedule_and_unknown_size(tmp_path):
    script = tmp_path / "step_decay.py"  # PyTorch's ImageNet example: /10 every 30 epochs.
    script.write_text(
        "def lr(step, steps_per_epoch):\n    return 0.1 * 0.1 ** (step // (30 * steps_per_epoch))\n"
    )
    result = lr_schedule(
        f"--lr_schedule={script}:lr",
        "--dataset=cifar10",
        "--epochs=90",
        "--batch_size=500",
        "--rows=4",
    )
    assert result.returncode == 0, result.stderr
    # 100 steps per epoch; 0.1 divided by 10 every 30 epochs; rows at 0, 3000, 5999, 8999.
    table = [line.split() for line in result.stdout.splitlines()[2:6]]
    assert [(int(s), float(lr)) for s, _, lr in table] == [
        (0, 0.1),
        (3000, 0.01),
        (5999, 0.01),
        (8999, 0.001),
    ]
    result = lr_schedule("--dataset=folder:/somewhere", "--epochs=1")
    assert result.returncode == 2
    assert "pass --examples_per_epoch=N" in result.stderr and "Traceback" not in result.stderr
