"""The `resnet-app model` summary CLI, run as a user would."""

import json

import pytest

from resnet_app.nets import presets
from tests.commands import run_command
from tests.reference import closed_form_macs, closed_form_params


def run_cli(*args):
    return run_command("resnet_app.tools.model_summary", *args)


def test_json_summary_of_resnet20():
    result = run_cli("--model=resnet20", "--json")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["trainable_params"] == 269_722  # He et al. 2015: 0.27M.
    assert summary["params"] == summary["trainable_params"] + summary["non_trainable_params"]
    assert summary["macs"] == closed_form_macs(presets.get_config("resnet20"), 32)
    assert summary["stages"] == [[32, 32, 16], [16, 16, 32], [8, 8, 64]]


def test_json_summary_of_a_family_preset_reports_timms_count():
    result = run_cli("--model=resnet18d", "--json")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["trainable_params"] == 11_708_744  # timm 1.0.31's resnet18d.
    assert summary["macs"] == closed_form_macs(presets.get_config("resnet18d"), 224)
    assert summary["stem"] == [56, 56, 64]


def test_table_summary_with_overridden_classes_and_size():
    result = run_cli("--model=resnet18", "--num_classes=10", "--image_size=64")
    assert result.returncode == 0, result.stderr
    assert "resnet18 at 64x64, 10 classes" in result.stdout
    assert "stage4   2 x 2 x 512" in result.stdout
    # 11,689,512 with 1000 classes; 990 fewer classes drop 990 * 513 weights.
    assert f"trainable {11_689_512 - 990 * 513:,}" in result.stdout
    # BN moving mean and variance: 2 x the BN channels (closed form).
    non_trainable = closed_form_params(presets.get_config("resnet18"))[1]
    assert f"non-trainable {non_trainable:,}" in result.stdout
    assert "MACs per image:" in result.stdout


@pytest.mark.parametrize(
    "args,message",
    [
        (["--model=resnet51"], "unknown model 'resnet51' (did you mean resnet56 or resnet50"),
        (["--model=resnet20", "--num_classes=0"], "'num_classes'"),
        (["--model=resnet20", "--image_size=big"], "--image_size=big"),
        (["--model=resnet20", "--image_size=0"], "--image_size must be positive"),
        (["--modle=resnet20"], "Unknown command line flag 'modle'"),
        ([], "--model"),
        (["--model=resnet20", "resnet50"], "unexpected argument(s) resnet50"),
    ],
)
def test_user_mistakes_get_one_line_and_status_2(args, message):
    result = run_cli(*args)
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ") and message in lines[0]


def test_help_lists_the_flags_and_the_user_facing_presets():
    result = run_cli("--help")  # absl exits 1 after printing help.
    for flag in ("--model", "--num_classes", "--image_size", "--[no]json"):
        assert flag in result.stdout
    assert "resnet1202" in result.stdout and "tiny" not in result.stdout


@pytest.mark.parametrize(
    "sets,message",
    [
        (["model.name=resnet18", "model.groups=32"], "this model has basic blocks"),
        (["model.name=seresnet50", "model.attention=cbam"], "must be one of: none, se, eca"),
        (["model.name=resnet50d", "model.stem_kernel=7"], "but resnet50d has stem=deep"),
        (["model.name=resnet50", "model.stem=tiered"], "'stem' must be one of: plain, deep"),
    ],
)
def test_family_mistakes_in_a_training_command_get_one_line_and_status_2(sets, message, tmp_path):
    result = run_command(
        "resnet_app.train", *[f"--set={s}" for s in sets], f"--model_dir={tmp_path / 'run'}"
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert message in lines[0]
    assert not (tmp_path / "run").exists()  # Nothing written.
