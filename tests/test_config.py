"""The training config: defaults, recipes, --set, and one-line errors naming the key."""

import glob
import os
import re

import pytest
import yaml

from resnet_app import config
from resnet_app.common.errors import ConfigError
from resnet_app.engine import schedules

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = sorted(glob.glob(os.path.join(REPO, "configs", "*.yaml")))

# He et al. 2015, table 6: CIFAR-10 test accuracy (%).
HE_CIFAR10 = {20: "91.25", 32: "92.49", 44: "92.83", 56: "93.03", 110: "93.57"}


def test_defaults_are_he_et_al_cifar_recipe():
    resolved = config.resolve()
    assert resolved.model_name == "resnet20"
    assert resolved.train.batch_size == 128
    assert resolved.train.train_steps == 64_000 and resolved.train.epochs is None
    assert resolved.optimizer == {
        "class": "momentum",
        "learning_rate": 0.1,
        "momentum": 0.9,
        "nesterov": False,
    }
    schedule = schedules.create_schedule(
        resolved.schedule, base_lr=0.1, global_batch_size=128, total_steps=64_000
    )
    # LR 0.1, divided by 10 at 32k and 48k iterations.
    for step, expected in [
        (0, 0.1),
        (31_999, 0.1),
        (32_000, 0.01),
        (47_999, 0.01),
        (48_000, 0.001),
    ]:
        assert schedule(step, 390) == pytest.approx(expected)


def test_every_recipe_in_configs():
    names = {os.path.basename(path) for path in CONFIGS}
    expected = {f"cifar10_resnet{depth}.yaml" for depth in HE_CIFAR10}
    expected |= {"cifar100_resnet56.yaml", "imagenet_resnet50.yaml", "shapes_resnet20.yaml"}
    assert expected <= names
    for path in CONFIGS:
        name = os.path.basename(path)
        with open(path) as f:
            text = f.read()
        assert text.startswith("#"), name
        assert f"python -m resnet_app.train --config=configs/{name}" in text, name
        resolved = config.resolve(path)
        match = re.fullmatch(r"cifar10_resnet(\d+)\.yaml", name)
        if match:
            depth = int(match.group(1))
            assert f"{HE_CIFAR10[depth]}%" in text
            assert resolved.model_name == f"resnet{depth}"
            assert resolved.data.dataset == "cifar10"
            assert resolved.train.batch_size == 128 and resolved.train.train_steps == 64_000


def test_imagenet_recipe_is_goyal_et_al():
    resolved = config.resolve(os.path.join(REPO, "configs", "imagenet_resnet50.yaml"))
    batch = resolved.train.batch_size
    steps_per_epoch = 1_281_167 // batch
    total = 90 * steps_per_epoch
    assert resolved.train.epochs == 90
    schedule = schedules.create_schedule(
        resolved.schedule, base_lr=0.1, global_batch_size=batch, total_steps=total
    )
    peak = 0.1 * batch / 256
    warmup = 5 * steps_per_epoch
    # Goyal et al.: linear from 0.1 to 0.1 x B/256 over 5 epochs.
    assert schedule(0, steps_per_epoch) == pytest.approx(0.1 + (peak - 0.1) / warmup)
    assert schedule(warmup - 1, steps_per_epoch) == pytest.approx(peak)
    assert schedule(warmup // 2 - 1, steps_per_epoch) == pytest.approx(
        0.1 + (peak - 0.1) * (warmup // 2) / warmup
    )
    assert schedule(30 * steps_per_epoch - 1, steps_per_epoch) == pytest.approx(peak)
    assert schedule(30 * steps_per_epoch, steps_per_epoch) == pytest.approx(peak / 10)
    assert schedule(80 * steps_per_epoch, steps_per_epoch) == pytest.approx(peak / 1000)


def test_set_overrides_any_key_with_yaml_values():
    resolved = config.resolve(
        sets=[
            "optimizer.learning_rate=0.05",
            "model.bn_synchronized=true",
            "data.area_range=[0.25, 1]",
            "train.epochs=2.5",
        ]
    )
    assert resolved.optimizer["learning_rate"] == 0.05
    assert resolved.model["bn_synchronized"] is True
    assert resolved.data.area_range == (0.25, 1.0)
    # Setting epochs replaces the default length in steps.
    assert resolved.train.epochs == 2.5 and resolved.train.train_steps is None


def test_flags_come_last_and_a_new_kind_starts_its_section_afresh(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("train:\n  batch_size: 64\n  epochs: 3\n")
    resolved = config.resolve(
        str(recipe),
        sets=["schedule.name=cosine", "optimizer.class=adam"],
        overrides={"train": {"train_steps": 10}},
    )
    assert resolved.train.batch_size == 64
    assert resolved.train.train_steps == 10 and resolved.train.epochs is None
    assert resolved.schedule == {"name": "cosine"}
    assert resolved.optimizer == {"class": "adam"}


def test_written_config_reads_back_the_same(tmp_path):
    resolved = config.resolve(
        os.path.join(REPO, "configs", "imagenet_resnet50.yaml"), sets=["train.seed=3"]
    )
    path = str(tmp_path / "config.yaml")
    config.write_yaml(resolved, path)
    with open(path) as f:
        assert config.from_dict(yaml.safe_load(f)) == resolved
    assert resolved.data.seed == 3


@pytest.mark.parametrize(
    "sets,message",
    [
        (["trian.batch_size=3"], "unknown config section 'trian'"),
        (["train.batchsize=3"], "unknown train key.*batchsize.*valid keys:.*batch_size"),
        (["train.batch_size=many"], r"train.batch_size='many': expected int"),
        (["train.train_steps=0"], r"train.train_steps=0; use 1 or more"),
        (["train.epochs=-1"], r"train.epochs=-1.0; use a number more than 0"),
        (["train.epochs=.inf"], r"train.epochs=inf: expected a finite number"),
        (["data.area_range=[a, b]"], r"data.area_range=\['a', 'b'\]: expected a list of numbers"),
        (["model.units=[1.5, 2]"], "expected a list of integers"),
        (["model.name=resnet21"], "unknown model 'resnet21'; valid models:.*resnet20"),
        (["model.widht=3"], "unknown model key.*widht"),
        (["model.bn_momentum=2"], "bn_momentum"),
        (["data.datset=x"], "unknown data key.*datset"),
        (["data.seed=1"], "unknown data key.*seed"),
        (["schedule.boundary=[1]"], "unknown schedule key 'boundary'"),
        (["schedule.name=linear"], "linear"),
        (["train.batch_size"], "use --set section.key=value"),
        (["batch_size=3"], "keys look like section.key"),
        (["train.epochs=1", "train.train_steps=5", "train.epochs=null"], None),
    ],
)
def test_bad_settings_name_the_key(sets, message):
    if message is None:  # The last one is fine: a later --set wins.
        assert config.resolve(sets=sets).train.train_steps == 5
        return
    with pytest.raises(ConfigError, match=message) as error:
        config.resolve(sets=sets)
    assert "\n" not in str(error.value)


def test_bad_files(tmp_path):
    with pytest.raises(ConfigError, match="missing.yaml not found; recipes are in configs/"):
        config.resolve(str(tmp_path / "missing.yaml"))
    broken = tmp_path / "broken.yaml"
    broken.write_text("train:\n  batch_size: [1,\n")
    with pytest.raises(ConfigError, match="not valid YAML at line"):
        config.resolve(str(broken))
    listing = tmp_path / "list.yaml"
    listing.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="must be a mapping of sections"):
        config.resolve(str(listing))
    both = tmp_path / "both.yaml"
    both.write_text("train:\n  epochs: 1\n  train_steps: 5\n")
    with pytest.raises(ConfigError, match="exactly one of train.epochs and train.train_steps"):
        config.resolve(str(both))


def test_alternatives_replace_each_other_and_order_within_a_layer_is_free(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("schedule:\n  name: piecewise\n  boundaries: [100]\n  values: [0.2, 0.02]\n")
    resolved = config.resolve(str(recipe))
    # The default's multipliers gave way to the recipe's values.
    assert resolved.schedule == {"name": "piecewise", "boundaries": [100], "values": [0.2, 0.02]}
    resolved = config.resolve(sets=["optimizer.learning_rate=0.05", "optimizer.class=sgd"])
    assert resolved.optimizer == {"class": "sgd", "learning_rate": 0.05}
    resolved = config.resolve(
        str(recipe), sets=["schedule.multipliers=[1, 0.5]"], overrides={"train": {"epochs": 2}}
    )
    assert "values" not in resolved.schedule and resolved.schedule["multipliers"] == [1, 0.5]
    assert resolved.train.epochs == 2 and resolved.train.train_steps is None


def test_exponent_numbers_are_numbers():
    # Plain YAML 1.1 would read 1e-3 as a string.
    resolved = config.resolve(sets=["optimizer.learning_rate=1e-3", "train.nan_lr_factor=5E-1"])
    assert resolved.optimizer["learning_rate"] == 0.001
    assert resolved.train.nan_lr_factor == 0.5
