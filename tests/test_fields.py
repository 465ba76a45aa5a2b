"""A setting declares its range once (`fields.setting`); every config class enforces it."""

import dataclasses
import math

import numpy as np
import pytest

from resnet_app.common import fields
from resnet_app.common.errors import ConfigError
from resnet_app.config import oneof
from resnet_app.config.optimizer_kinds import OptimizerSection
from resnet_app.config.schedule_kinds import ScheduleSection
from resnet_app.config.sections import SyncSettings, TrainSettings
from resnet_app.data import settings as data_settings
from resnet_app.evaluation import soup
from resnet_app.nets.spec import ResNetConfig

# Each rule against its closed form: (rule, values it takes, values it refuses).
RULES = [
    (fields.AT_LEAST_0, [0, 0.0, 3, 1e9], [-1e-12, -1, math.nan, math.inf, True, "1", None]),
    (fields.MORE_THAN_0, [1e-12, 2, 7.5], [0, -0.0, -3, math.inf, False, "2"]),
    (fields.AT_LEAST_1, [1, 2, np.int64(5)], [0, -1, 1.5, 2.0, True, "3"]),
    (fields.FRACTION, [0, 0.5, 0.999999], [1, 1.0, -0.1, math.nan, True]),
    (fields.PROBABILITY, [1e-9, 0.5, 0.999], [0, 1, 1.5]),
    (fields.SHARE, [1e-9, 0.5, 1], [0, 1.0000001]),
    (fields.FLAG, [True, False], [0, 1, "true", None]),
    (fields.interval(2, 5, high_in=True), [2, 3.5, 5], [1.999, 5.001]),
    (fields.whole_at_least(0), [0, 4], [-1, 0.5]),
]


@pytest.mark.parametrize("rule, good, bad", RULES)
def test_each_rule_takes_its_range_and_refuses_the_rest_in_one_line(rule, good, bad):
    for value in good:
        assert rule.check("x", value) == value
    for value in bad:
        with pytest.raises(ConfigError) as error:
            rule.check("train.x", value)
        assert str(error.value) == f"train.x must be {rule.wanted}, got {value!r}"


def test_valid_values_are_stored_as_the_rule_converts_them():
    assert type(fields.AT_LEAST_1.check("x", np.int64(3))) is int
    assert type(fields.AT_LEAST_0.check("x", 3)) is float
    assert type(fields.FRACTION.check("x", 0)) is float
    assert fields.one_of(("a", "b")).check("x", "a") == "a"


def test_choices_are_read_when_checking_so_a_registry_may_grow():
    registry = {"plain": 1}
    rule = fields.one_of(registry)
    with pytest.raises(ConfigError, match=r"^x must be one of: plain, got 'deep'$"):
        rule.check("x", "deep")
    registry["deep"] = 2
    assert rule.check("x", "deep") == "deep"
    with pytest.raises(ConfigError, match=r"^x must be one of: plain, deep, got \['a'\]$"):
        rule.check("x", ["a"])  # Unhashable: refused, not a TypeError.


@dataclasses.dataclass(frozen=True)
class Toy:
    """A toy settings class, declared as the config's sections are."""

    rate: float = fields.setting(0.1, fields.FRACTION)
    sizes: tuple[int, ...] = fields.setting((8, 16), fields.AT_LEAST_1)
    weights: dict[str, float] | None = fields.setting(None, fields.AT_LEAST_0)
    mode: str | None = fields.setting(None, fields.one_of(("fast", "slow")))
    steps: int | None = oneof.alternative("epochs", required=True, rule=fields.AT_LEAST_1)
    epochs: float | None = oneof.alternative("steps", required=True, rule=fields.MORE_THAN_0)
    free: int = 3  # No rule: anything of its type.

    def __post_init__(self):
        fields.check_declared(self, "toy.{}")
        oneof.check_alternatives(self, "toy.{}")


def test_a_declared_field_is_checked_with_its_items_and_values():
    toy = Toy(steps=np.int64(4), sizes=[np.int64(2)], weights={"a": 1})
    assert toy.steps == 4 and type(toy.steps) is int
    assert toy.sizes == (2,) and type(toy.sizes[0]) is int
    assert toy.weights == {"a": 1.0} and type(toy.weights["a"]) is float
    cases = [
        (dict(rate=1.0), "toy.rate must be in [0, 1), got 1.0"),
        (dict(sizes=(8, 0)), "an entry of toy.sizes must be a whole number >= 1, got 0"),
        (dict(weights={"a": 1.0, "b": -2.0}), "toy.weights.b must be a number >= 0, got -2.0"),
        (dict(mode="medium"), "toy.mode must be one of: fast, slow, got 'medium'"),
        (dict(steps=0), "toy.steps must be a whole number >= 1, got 0"),
        (dict(rate=[0.1]), "toy.rate must be in [0, 1), got [0.1]"),  # Not a list field.
    ]
    for values, message in cases:
        with pytest.raises(ConfigError) as error:
            Toy(**{"steps": 1, **values})
        assert str(error.value) == message


def test_alternatives_are_checked_from_their_declaration():
    assert Toy(epochs=0.5).epochs == 0.5
    with pytest.raises(
        ConfigError, match=r"^toy.steps and toy.epochs exclude each other; keep one$"
    ):
        Toy(steps=2, epochs=1.0)
    with pytest.raises(ConfigError, match=r"^give one of toy.steps and toy.epochs$"):
        Toy()
    assert Toy(steps=1, free=-7).free == -7


def _sections():
    """(a valid instance, how its messages name a field) of every config class with rules."""
    yield TrainSettings(), "train.{}"
    yield SyncSettings(), "sync.{}"
    yield data_settings.DataConfig(), "data.{}"
    yield data_settings.AugmentSettings(), "data.augment.{}"
    yield data_settings.MixSettings(), "data.mix.{}"
    yield data_settings.ProgressiveSettings(), "data.progressive.{}"
    yield ResNetConfig(), "model field '{}'"
    yield soup.AverageRequest(), "--{}"
    for kind in OptimizerSection.KINDS.values():
        yield kind(), "optimizer"
    needed = {
        "piecewise": dict(boundaries=(0.5,), unit="fraction", multipliers=(1.0, 0.1)),
        "exponential": dict(decay_rate=0.5, decay_steps=10),
        "script": dict(path="x.py:f"),
    }
    for name, kind in ScheduleSection.KINDS.items():
        yield kind(**needed.get(name, {})), "schedule key '{}'"


CANDIDATES = [-1, 0, 1, 0.5, 1.5, 7, 10**6, -0.5, "nonsense", ""]


@pytest.mark.parametrize("instance, name", list(_sections()), ids=lambda x: type(x).__name__)
def test_every_declared_rule_is_enforced_by_its_class(instance, name):
    checked = 0
    for field in dataclasses.fields(instance):
        rule = field.metadata.get(fields.CHECK)
        if rule is None:
            continue
        is_list = isinstance(getattr(instance, field.name), tuple)
        bad = next(value for value in CANDIDATES if not rule.test(value))
        given = (bad,) if is_list else bad
        if field.metadata.get(oneof.ALTERNATIVE):  # Its pair stays unset.
            changes = {field.name: given, field.metadata[oneof.ALTERNATIVE]: None}
        else:
            changes = {field.name: given}
        with pytest.raises(ConfigError) as error:
            dataclasses.replace(instance, **changes)
        wanted = rule.wanted() if callable(rule.wanted) else rule.wanted
        assert f"must be {wanted}, got {bad!r}" in str(error.value), field.name
        assert field.name in str(error.value) and name.format(field.name).split("{")[0] in str(
            error.value
        )
        checked += 1
    assert checked >= 1
