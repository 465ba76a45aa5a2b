"""The training config: defaults, recipes, --set, and one-line errors naming the key."""

import contextlib
import dataclasses
import glob
import json
import os
import re

import pytest
import yaml

from resnet_app import config
from resnet_app.common import fields
from resnet_app.common.errors import ConfigError
from resnet_app.config import oneof, optimizer_kinds, recipes, schedule_kinds
from resnet_app.data import settings
from resnet_app.data.settings import AugmentSettings, DataConfig
from resnet_app.engine import schedules
from resnet_app.nets import presets

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
    expected |= {"shapes_quickstart.yaml"}
    assert expected <= names
    for path in CONFIGS:
        name = os.path.basename(path)
        with open(path) as f:
            text = f.read()
        assert text.startswith("#"), name
        commands = (
            f"python -m resnet_app.train --config=configs/{name}",
            f"resnet-app train --config={name[: -len('.yaml')]}",
        )
        assert any(command in text for command in commands), name
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


# The published recipes' tables: "ResNet strikes back" (Wightman et al. 2021, table 1)
# and torchvision's IMAGENET1K_V2 command (references/classification's README):
# (epochs, global batch, optimizer, LR, its weight decay, model L2, label smoothing,
# Mixup, CutMix, repeats, stochastic depth, train size, test size, test resize, loss).
PUBLISHED_RECIPES = {
    "imagenet_resnet50_rsb_a1": (600, 2048, "lamb", 5e-3, 0.01, 0, 0.1, 0.2, 1.0, 3, 0.05,
                                 224, 224, 235, "bce"),
    "imagenet_resnet50_rsb_a2": (300, 2048, "lamb", 5e-3, 0.02, 0, 0.0, 0.1, 1.0, 3, 0.05,
                                 224, 224, 235, "bce"),
    "imagenet_resnet50_rsb_a3": (100, 2048, "lamb", 8e-3, 0.02, 0, 0.0, 0.1, 1.0, 1, 0.0,
                                 160, 224, 235, "bce"),
    "imagenet_resnet50_tv2": (600, 1024, "momentum", 0.5, None, 2e-5, 0.1, 0.2, 1.0, 4, 0.0,
                              176, 224, 232, "cross_entropy"),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(PUBLISHED_RECIPES))
def test_the_peers_recipes_are_their_published_tables(name):
    (epochs, batch, optimizer, lr, decay, l2, smoothing, mixup, cutmix, repeats, drop_path,
     size, test_size, resize, loss) = PUBLISHED_RECIPES[name]  # fmt: skip
    resolved = config.resolve(name)
    train, data = resolved.train, resolved.data
    model = presets.get_config(resolved.model_name, **resolved.model_overrides)
    assert (train.epochs, train.batch_size, train.loss) == (epochs, batch, loss)
    assert resolved.optimizer["class"] == optimizer
    assert resolved.optimizer["learning_rate"] == pytest.approx(lr)
    assert resolved.optimizer.get("weight_decay") == decay
    assert model.weight_decay == pytest.approx(l2)
    assert train.label_smoothing == smoothing and model.drop_path_rate == drop_path
    assert (data.mix.mixup_alpha, data.mix.cutmix_alpha) == (mixup, cutmix)
    assert data.augment.repeats == repeats
    assert (data.image_size or 224, data.eval_image_size or 224) == (size, test_size)
    assert data.eval_resize == resize
    assert resolved.schedule["name"] == "cosine" and resolved.schedule["warmup_epochs"] == 5
    if loss == "bce":  # timm's A1-A3: rand-mM-mstd0.5-inc1 and the target threshold.
        assert train.bce_target_threshold == 0.2
        assert data.augment.randaugment_prob == 0.5
        assert data.augment.randaugment_magnitude_std == 0.5
        assert data.augment.randaugment_magnitude == {"a1": 7, "a2": 7, "a3": 6}[name[-2:]]
    else:  # torchvision: TrivialAugment-wide, random erasing 0.1, an EMA.
        assert data.augment.auto_augment == "ta_wide" and data.augment.erase_probability == 0.1
        # torchvision's --model-ema-decay 0.99998 every 32 steps, adjusted by its
        # world size x batch x steps / epochs (train.py), as a decay per step.
        per_32 = 1 - min(1.0, (1 - 0.99998) * 8 * 128 * 32 / 600)
        assert train.ema_decay == pytest.approx(per_32 ** (1 / 32), abs=1e-6)


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
    assert resolved.data.augment.area_range == (0.25, 1.0)
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
        (["train.train_steps=0"], r"train.train_steps must be a whole number >= 1, got 0"),
        (["train.epochs=-1"], r"train.epochs must be a number > 0, got -1.0"),
        (["train.epochs=.inf"], r"train.epochs=inf: expected a finite number"),
        (
            ["data.area_range=[a, b]"],
            r"data.augment.area_range=\['a', 'b'\]: expected a list of numbers",
        ),
        (["model.units=[1.5, 2]"], "expected a list of integers"),
        (
            ["model.name=resnet21"],
            r"unknown model 'resnet21' \(did you mean .*\); valid models:.*resnet20",
        ),
        (["model.name=null"], "model.name=None; valid models:.*resnet20"),
        (["model.widht=3"], "unknown model key.*widht"),
        (["model.bn_momentum=2"], "bn_momentum"),
        (["data.datset=x"], "unknown data key.*datset"),
        (["data.seed=1"], "unknown data key.*seed"),
        (["schedule.boundary=[1]"], "unknown schedule key 'boundary'"),
        (["schedule.name=triangle"], "unknown schedule .triangle.*linear"),
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
    with pytest.raises(
        ConfigError, match="missing.yaml not found; give a path .* cifar10_resnet56"
    ):
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
    with pytest.raises(ConfigError, match="train.epochs and train.train_steps exclude each other"):
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


# --- The typed tree ----------------------------------------------------------------------

FIXTURE_RUN = os.path.join(REPO, "tests", "fixtures", "run_v0_tiny")


def test_the_defaults_are_the_dataclasses():
    # Nothing but the dataclasses' defaults: no table of defaults on the side.
    assert config.resolve() == config.Config()
    default = config.Config()
    assert isinstance(default.optimizer, optimizer_kinds.Momentum)
    assert isinstance(default.schedule, schedule_kinds.Piecewise)
    assert (default.schedule.boundaries, default.schedule.unit) == ((0.5, 0.75), "fraction")
    assert default.schedule.multipliers == (1.0, 0.1, 0.01)
    assert (default.optimizer.learning_rate, default.optimizer.momentum) == (0.1, 0.9)


def test_sections_are_typed_and_read_as_their_yaml_mappings():
    resolved = config.resolve(
        sets=["optimizer.class=adamw", "optimizer.weight_decay=0.05", "schedule.name=cosine"]
    )
    assert type(resolved.optimizer) is optimizer_kinds.AdamW
    assert resolved.optimizer.kind == "adamw" and resolved.optimizer.weight_decay == 0.05
    assert resolved.optimizer.beta_2 == 0.999  # The kind's default.
    assert resolved.schedule.kind == "cosine" and resolved.schedule.total_steps is None
    # The mapping view: the keys that have a value, in YAML form.
    assert dict(resolved.schedule) == {"name": "cosine", "final": 0.0, "warmup_start": 0.0}
    assert resolved.optimizer != {"class": "adamw"}  # weight_decay differs from the default.
    assert resolved.optimizer == {"class": "adamw", "weight_decay": 0.05}


def test_types_come_from_the_annotations():
    # Read with typing.get_type_hints: the `from __future__ import annotations`
    # strings are resolved, never split.
    train = fields.field_types(config.TrainSettings)
    assert train["batch_size"] == fields.FieldType(int)
    assert train["epochs"] == fields.FieldType(float, optional=True)
    data = fields.field_types(DataConfig)
    assert data["augment"].nested and data["augment"].base is AugmentSettings
    assert fields.field_types(AugmentSettings)["area_range"] == fields.FieldType(tuple, item=float)
    assert data["mean"] == fields.FieldType(tuple, optional=True, item=float)
    model = fields.field_types(config.ModelSection)
    assert model["units"] == fields.FieldType(tuple, optional=True, item=int)
    assert model["name"] == fields.FieldType(str)
    for kind in [*optimizer_kinds.OptimizerSection.KINDS.values()]:
        assert fields.field_types(kind)["learning_rate"] == fields.FieldType(float)
    with pytest.raises(TypeError):
        fields.read_annotation("int")  # A string annotation is a bug, not a type.
    with pytest.raises(TypeError):
        fields.read_annotation(list[int])


@pytest.mark.parametrize(
    "cls, expected",
    [
        (config.TrainSettings, {"epochs": "train_steps", "train_steps": "epochs"}),
        (
            schedule_kinds.Piecewise,
            {
                "values": "multipliers",
                "multipliers": "values",
                "warmup_steps": "warmup_epochs",
                "warmup_epochs": "warmup_steps",
            },
        ),
        (schedule_kinds.Script, {}),
        (optimizer_kinds.SGD, {"clipnorm": "global_clipnorm", "global_clipnorm": "clipnorm"}),
    ],
)
def test_alternative_keys_are_field_metadata(cls, expected):
    assert oneof.alternatives(cls) == expected


@pytest.mark.parametrize(
    "recipe, later, dropped, kept",
    [
        ("schedule: {warmup_steps: 10}", "schedule.warmup_epochs=2", "warmup_steps", 2.0),
        (
            "schedule: {name: exponential, decay_rate: 0.5, decay_steps: 10}",
            "schedule.decay_epochs=2",
            "decay_steps",
            2.0,
        ),
        ("schedule: {name: cosine, total_epochs: 3}", "schedule.total_steps=5", "total_epochs", 5),
        ("optimizer: {clipnorm: 1}", "optimizer.global_clipnorm=2", "clipnorm", 2.0),
    ],
)
def test_a_later_layer_drops_the_alternative(tmp_path, recipe, later, dropped, kept):
    path = tmp_path / "r.yaml"
    path.write_text(recipe + "\n")
    section, assignment = later.split(".")
    given = assignment.split("=")[0]
    values = getattr(config.resolve(str(path), sets=[later]), section)
    assert getattr(values, given) == kept and getattr(values, dropped) is None
    # Both in one layer are refused, naming them.
    both = config.read_yaml(str(path))
    both[section][given] = kept
    with pytest.raises(ConfigError) as error:
        config.from_dict(both)
    assert dropped in str(error.value) and given in str(error.value)


def test_model_overrides_hold_only_what_the_user_set():
    resolved = config.resolve(sets=["model.bn_synchronized=false", "model.widths=[8, 16, 32]"])
    assert resolved.model_overrides == {"widths": (8, 16, 32), "bn_synchronized": False}
    assert resolved.model == {"name": "resnet20", "widths": [8, 16, 32], "bn_synchronized": False}
    assert config.resolve().model_overrides == {}
    # bn_synchronized=false is the preset's own value: the same setting.
    same = config.resolve(sets=["model.bn_synchronized=false"])
    assert config.changes(config.resolve(), same) == {}


def test_the_optimizer_is_checked_before_training():
    # Before the typed tree, these passed until the trainer built the optimizer.
    with pytest.raises(ConfigError, match="optimizer 'momentum' argument 'learning_rate'"):
        config.resolve(sets=["optimizer.learning_rate=-0.1"])
    with pytest.raises(ConfigError, match="unknown argument.*momentun.*class 'momentum'"):
        config.resolve(sets=["optimizer.momentun=0.5"])


def test_written_config_records_a_derived_dtype_as_null(tmp_path):
    resolved = config.resolve(sets=["train.precision=bf16"])
    assert resolved.data.dtype == "bfloat16" and resolved.derived == {"data.dtype"}
    assert yaml.safe_load(config.to_yaml(resolved))["data"]["dtype"] is None
    chosen = config.resolve(sets=["train.precision=bf16", "data.dtype=float32"])
    assert chosen.data.dtype == "float32" and not chosen.derived
    assert yaml.safe_load(config.to_yaml(chosen))["data"]["dtype"] == "float32"


def test_a_resumed_run_derives_the_dtype_from_its_new_precision(tmp_path):
    """`--model_dir=RUN --precision=bf16 --allow_config_change`, at the config level."""
    run = tmp_path / "config.yaml"
    config.write_yaml(config.resolve(sets=["model.name=tiny"]), str(run))
    saved = config.read_run_config(str(tmp_path))
    assert saved.data.dtype == "float32"
    # What train.py does with --model_dir=RUN and no --config: the run's file, then flags.
    resumed = config.resolve(str(run), overrides={"train": {"precision": "bf16"}})
    assert resumed.data.dtype == "bfloat16"
    assert config.changes(saved, resumed) == {
        "data.dtype": ("float32", "bfloat16"),
        "train.precision": ("fp32", "bf16"),
    }


def test_an_old_run_config_reads_and_round_trips():
    """A config.yaml written before the typed tree (dtype frozen as float32)."""
    old = config.from_dict(config.read_yaml(os.path.join(FIXTURE_RUN, "config.yaml")))
    assert old.model_name == "tiny" and old.model_overrides == {}
    assert old.train.train_steps == 6 and old.train.batch_size == 16
    assert old.data.train_examples == 64 and old.data.eval_examples == 37
    assert old.optimizer == optimizer_kinds.Momentum()
    # Written when the default's boundaries were in steps: read as written.
    he = {"boundaries": [32000, 48000], "multipliers": [1.0, 0.1, 0.01]}
    assert old.schedule == schedule_kinds.ScheduleSection.from_mapping({"name": "piecewise", **he})
    assert config.from_yaml(config.to_yaml(old), "the fixture") == old
    assert old == config.read_run_config(FIXTURE_RUN)
    # It recorded float32, so it keeps float32 whatever the precision.
    assert old.data.dtype == "float32" and not old.derived
    resumed = config.resolve(
        os.path.join(FIXTURE_RUN, "config.yaml"), overrides={"train": {"precision": "bf16"}}
    )
    assert resumed.data.dtype == "float32"
    assert config.changes(old, resumed) == {"train.precision": ("fp32", "bf16")}


@pytest.mark.parametrize("path", CONFIGS, ids=os.path.basename)
def test_recipes_do_not_restate_defaults(path):
    # Every key of a recipe changes the config it gives, but the names of a
    # section's kind or preset, which keep a recipe readable on its own.
    recipe = config.read_yaml(path)
    resolved = config.resolve(path)
    for section, values in recipe.items():
        for key in values:
            if (section, key) in {("model", "name"), ("optimizer", "class"), ("schedule", "name")}:
                continue
            without = {**recipe, section: {k: v for k, v in values.items() if k != key}}
            # A key the recipe does not read without is needed.
            with contextlib.suppress(ConfigError):
                assert config.from_dict(without) != resolved, f"{section}.{key} restates a default"


def test_old_flat_data_keys_read_as_their_nested_groups(tmp_path):
    flat = tmp_path / "flat.yaml"
    flat.write_text(
        "data:\n  flip: false\n  crop_padding: 2\n  mixup_alpha: 0.3\n  mix_mode: example\n"
    )
    nested = tmp_path / "nested.yaml"
    nested.write_text(
        "data:\n  augment:\n    flip: false\n    crop_padding: 2\n"
        "  mix:\n    mixup_alpha: 0.3\n    mode: example\n"
    )
    old, new = config.resolve(str(flat)), config.resolve(str(nested))
    assert old.data == new.data
    assert new.data.augment.flip is False and new.data.mix.mode == "example"
    # A group's keys add up across layers; a later layer wins per key.
    layered = config.resolve(str(nested), ["data.augment.erase_probability=0.25", "data.flip=true"])
    augment = layered.data.augment
    assert (augment.flip, augment.crop_padding, augment.erase_probability) == (True, 2, 0.25)
    # What a run writes is nested, and reads back the same.
    assert config.from_dict(layered.to_dict()).data == layered.data
    assert "flip" in layered.to_dict()["data"]["augment"]
    assert "flip" not in layered.to_dict()["data"]


def test_old_layouts_are_history_moved_at_load_time():
    """The migration step: the old flat data keys move into their groups; a
    key added since (cutout_size) never had a flat name; data_info.json's old
    preprocessing record reads as today's."""
    from resnet_app.common import migration
    from resnet_app.data import run_pipeline
    from resnet_app.data.preprocessing import Preprocessing

    moved = migration.config_section("data", {"flip": False, "mix_mode": "example", "augment": {}})
    assert moved == {"augment": {"flip": False}, "mix": {"mode": "example"}}
    assert migration.config_section("train", {"flip": 1}) == {"flip": 1}
    with pytest.raises(ConfigError, match="cutout_size"):
        config.resolve(sets=["data.cutout_size=4"])
    assert config.resolve(sets=["data.augment.cutout_size=4"]).data.augment.cutout_size == 4
    # data_info.json written before the augmentation nested: its keys beside the others.
    augment = AugmentSettings(flip=False, crop_padding=2, erase_probability=0.25)
    today = Preprocessing("cifar", 28, (73.0,), (90.0,), augment=augment)
    old = {k: v for k, v in dataclasses.asdict(today).items() if k != "augment"}
    old.update(
        {
            k: v
            for k, v in dataclasses.asdict(augment).items()
            # Newer than that layout.
            if k not in ("cutout_size", "auto_augment", "repeats", *settings.AUGMIX_SETTINGS)
        }
    )
    info = json.loads(json.dumps({"class_names": ["a"], "preprocessing": old}))
    assert run_pipeline.parse_data_info(info) == (["a"], today)


def test_a_bad_nested_key_is_one_line():
    with pytest.raises(
        ConfigError, match=r"unknown data.augment key\(s\) flipp; valid keys: .*flip"
    ):
        config.resolve(sets=["data.augment.flipp=false"])
    with pytest.raises(ConfigError, match="config section 'data.mix' must be a mapping"):
        config.resolve(sets=["data.mix=3"])
    with pytest.raises(ConfigError, match="keys look like section.key"):
        config.resolve(sets=["train.a.b=1"])


def test_a_packaged_recipe_is_found_by_name_from_any_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    by_path = config.resolve(os.path.join(REPO, "configs", "cifar10_resnet56.yaml"))
    assert config.resolve("cifar10_resnet56") == by_path
    assert config.resolve("cifar10_resnet56.yaml") == by_path
    assert by_path.model.name == "resnet56"


def test_a_file_wins_over_a_packaged_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "cifar10_resnet56.yaml").write_text("model:\n  name: resnet20\n")
    assert config.resolve("cifar10_resnet56.yaml").model.name == "resnet20"
    assert config.resolve("cifar10_resnet56").model.name == "resnet56"


def test_configs_is_the_packaged_recipe_folder():
    packaged = sorted(f for f in os.listdir(recipes.RECIPE_DIR) if f.endswith(".yaml"))
    assert packaged == sorted(
        f for f in os.listdir(os.path.join(REPO, "configs")) if f.endswith(".yaml")
    )
    assert "shapes_quickstart" in recipes.names() and len(recipes.names()) == len(packaged)


def test_an_empty_run_config_is_an_error_not_every_default(tmp_path):
    """A config.yaml cut to nothing (a save lost in a power cut) must not read as defaults."""
    (tmp_path / "config.yaml").write_text("")
    with pytest.raises(ConfigError, match=r"config.yaml is empty; it was not written whole"):
        config.read_run_config(str(tmp_path))
    with pytest.raises(ConfigError, match=r"run/config.yaml is empty; it was not written whole"):
        config.from_yaml("\n", "run/config.yaml")


def test_an_unreadable_or_binary_config_is_one_line(tmp_path, monkeypatch):
    path = tmp_path / "config.yaml"
    path.write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff\xfe")  # Not text: a picture.
    with pytest.raises(ConfigError, match=r"config.yaml is not valid YAML"):
        config.read_run_config(str(tmp_path))

    def denied(*args, **kwargs):  # As for another user's file (root reads everything).
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr("builtins.open", denied)
    with pytest.raises(ConfigError, match=r"cannot read .*config.yaml \(Permission denied\)"):
        config.read_run_config(str(tmp_path))
    with pytest.raises(ConfigError, match=r"cannot read config file .* \(Permission denied\)"):
        config.read_yaml(str(path))


def test_a_section_or_key_given_twice_is_an_error(tmp_path):
    path = tmp_path / "twice.yaml"
    path.write_text("data:\n  image_size: 24\n  image_size: 32\n")
    with pytest.raises(ConfigError, match=r"'image_size' appears twice \(lines 2 and 3\)"):
        config.read_yaml(str(path))
    # YAML's merge key is not a repetition: the explicit key overrides the merged one.
    path.write_text("base: &b {epochs: 2, batch_size: 8}\ntrain:\n  <<: *b\n  epochs: 3\n")
    assert config.read_yaml(str(path))["train"] == {"epochs": 3, "batch_size": 8}


@pytest.mark.parametrize(
    "section, decays",
    [
        ({"class": "momentum"}, False),
        ({"class": "adam"}, False),
        ({"class": "adamw", "weight_decay": 0.0}, True),  # Decoupled: the class decays.
        ({"class": "lamb"}, False),
        ({"class": "lamb", "weight_decay": 0.01}, True),
        ({"class": "lars", "weight_decay": 1e-4}, True),
        ({"class": "lars"}, False),
    ],
)
def test_an_optimizer_kind_says_whether_it_decays_the_weights_itself(section, decays):
    """The trainer warns when such an optimizer meets a preset's L2 penalty (a second decay)."""
    kind = optimizer_kinds.OptimizerSection.from_mapping(section)
    assert kind.decays_weights is decays


def test_the_old_init_filter_reads_as_stem_kernel(tmp_path):
    """2026-12-04's rename: a config file, `--set`, a run's saved section and a saved
    model's Keras config that say `init_filter` build the network `stem_kernel` does."""
    from resnet_app.config.sections import ModelSection
    from resnet_app.nets import resnet

    old = tmp_path / "old.yaml"
    old.write_text("model:\n  name: resnet18\n  init_filter: 5\n")
    assert config.resolve(str(old)).model.stem_kernel == 5
    sets = ["model.name=resnet18", "model.init_filter=5"]
    assert config.resolve(sets=sets).model.stem_kernel == 5
    assert "init_filter" not in config.resolve(str(old)).to_dict()["model"]
    assert ModelSection.from_mapping({"name": "resnet18", "init_filter": 5}).stem_kernel == 5
    # Today's name wins over the old one given beside it.
    both = {"name": "resnet18", "init_filter": 5, "stem_kernel": 3}
    assert ModelSection.from_mapping(both).stem_kernel == 3
    model = resnet.create_model("tiny", stem_kernel=5)
    saved = model.get_config()
    saved["config"]["init_filter"] = saved["config"].pop("stem_kernel")
    assert resnet.ResNet.from_config(saved).config == model.config
