"""The learning check (slow, not in the default suite): `pytest -m slow tests/test_learning.py`.

The quickstart recipe (one epoch at batch 32) and the longer one (3 epochs at
batch 128) must each reach 90% test accuracy on `shapes`; on 2 CPU cores they
take about 2 and 4 minutes. A linear classifier on the pixels reaches about 10%
(scripts/check_shapes.py), chance is 10%.
"""

import json

import pytest

from tests.commands import run_command


@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["shapes_quickstart", "shapes_resnet20"])
def test_shapes_recipe_reaches_90_percent(tmp_path, recipe):
    result = run_command(
        "resnet_app.train",
        f"--config=configs/{recipe}.yaml",
        f"--model_dir={tmp_path / 'run'}",
        timeout=1800,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    with open(tmp_path / "run" / "metrics.jsonl") as f:
        final = [json.loads(line) for line in f if '"top1"' in line][-1]
    assert final["num_examples"] == 10_000
    assert final["top1"] >= 0.90
