"""`train.precision: auto`: the rule on cpuinfo texts of each CPU kind and on GPU capabilities,
and how a config records and resolves it."""

import pytest

from resnet_app import config
from resnet_app.common import auto_precision, hardware
from resnet_app.common.errors import ConfigError
from tests.test_hardware import AVX2, AVX512_BF16

# An AMD EPYC with AVX-512 and AVX512_BF16 but no AMX (Zen 4).
ZEN4 = """processor\t: 0
model name\t: AMD EPYC 9B14
flags\t\t: fpu sse4_1 avx avx2 fma avx512f avx512dq avx512_vnni avx512_bf16
"""
# An Intel Xeon with AVX-512 but no bfloat16 instructions (Cascade Lake).
CASCADE_LAKE = """processor\t: 0
model name\t: Intel(R) Xeon(R) CPU @ 2.80GHz
flags\t\t: fpu sse4_1 avx avx2 fma avx512f avx512dq avx512_vnni
"""


@pytest.mark.parametrize(
    "text, cap, forced, precision, why",
    [
        (AVX512_BF16, None, None, "bf16", "has AMX-BF16, which oneDNN uses"),
        (ZEN4, None, None, "bf16", "has AVX512_BF16, which oneDNN uses"),
        (CASCADE_LAKE, None, None, "fp32", "no AVX512_BF16 or AMX"),
        (AVX2, None, None, "fp32", "Eigen kernels here, not oneDNN"),
        # The AVX2 stand-in on a bf16 CPU: TF_ENABLE_ONEDNN_OPTS=0 ...
        (ZEN4, None, "0", "fp32", "Eigen kernels here, not oneDNN"),
        # ... and a oneDNN cap below its bfloat16 instructions.
        (AVX512_BF16, "AVX2", None, "fp32", "ONEDNN_MAX_CPU_ISA=AVX2 leaves out"),
        (ZEN4, "AVX512_CORE_BF16", None, "bf16", "AVX512_BF16"),
    ],
)
def test_on_a_cpu_bf16_only_where_its_instructions_are_in_use(text, cap, forced, precision, why):
    cpu = hardware.parse_cpuinfo(text, cap, forced)
    choice = auto_precision.choose(cpu, [])
    assert choice.precision == precision
    assert why in choice.reason
    assert choice.precision == ("bf16" if cpu.native_bf16 else "fp32")


@pytest.mark.parametrize(
    "capabilities, precision",
    [
        ([(7, 0)], "fp32"),  # V100: fp16 tensor cores only; never fp16 by surprise.
        ([(7, 5)], "fp32"),  # T4.
        ([(8, 0)], "bf16"),  # A100.
        ([(8, 6), (8, 9)], "bf16"),  # A10, L4.
        ([(9, 0)], "bf16"),  # H100.
        ([(8, 0), (7, 0)], "fp32"),  # Mixed: the slowest decides.
    ],
)
def test_on_gpus_bf16_from_compute_capability_8(capabilities, precision):
    # The GPUs decide, whatever the host CPU.
    for text in (AVX2, AVX512_BF16):
        choice = auto_precision.choose(hardware.parse_cpuinfo(text), capabilities)
        assert choice.precision == precision, (text, capabilities)
        assert "compute capability" in choice.reason


def test_cuda_visible_devices_selects_the_gpus(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,0")
    assert auto_precision._visible([0, 1, 2, 3]) == [2, 0]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "-1")
    assert auto_precision._visible([0, 1]) == []
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert auto_precision._visible([0, 1]) == []
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert auto_precision._visible([0, 1]) == [0, 1]


@pytest.mark.parametrize("chosen", ["fp32", "bf16"])
def test_a_config_resolves_auto_and_records_auto(monkeypatch, chosen):
    monkeypatch.setattr(
        auto_precision, "auto_choice", lambda: auto_precision.Choice(chosen, "test")
    )
    resolved = config.resolve(sets=["train.precision=auto"])
    assert resolved.train.precision == chosen
    assert resolved.data.dtype == config.PRECISIONS[chosen].compute_dtype
    tree = resolved.to_dict()
    assert tree["train"]["precision"] == "auto" and tree["data"]["dtype"] is None
    again = config.from_yaml(config.to_yaml(resolved), "config.yaml")
    assert again.train.precision == chosen and again.to_dict() == tree
    # As the run uses it: the same machine's resume sees no change.
    assert config.changes(resolved, again) == {}
    explicit = config.resolve(sets=["train.precision=fp32"])
    assert explicit.to_dict()["train"]["precision"] == "fp32"


def test_an_unknown_precision_names_auto():
    with pytest.raises(ConfigError, match="must be one of: fp32, bf16, fp16, auto, got 'fp8'"):
        config.resolve(sets=["train.precision=fp8"])


@pytest.mark.parametrize("name", ["fp32", "bf16", "fp16"])
def test_each_precision_builds_its_model_in_its_dtype_with_float32_weights(name):
    import keras

    from resnet_app.common import precision
    from resnet_app.nets import factory

    with factory.dtype_policy(precision.get(name).keras_policy):
        layer = keras.layers.Dense(2)
        layer.build((None, 3))
    assert layer.compute_dtype == {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}[name]
    assert config.PRECISIONS[name] is precision.get(name)
    assert layer.kernel.dtype == "float32"


def test_a_new_precision_is_one_registration(monkeypatch):
    """A precision registered here (float64; and a loss-scaled one) is checked, sets
    the images' dtype, builds its model in its dtype and meets the same refusals,
    with no other edit."""
    import numpy as np

    from resnet_app.common import precision
    from resnet_app.nets import factory

    fp64 = precision.Precision("fp64", "float64")
    scaled = precision.Precision("fp16_scaled", "float16", loss_scaling=True)
    for toy in (fp64, scaled):  # Restored after the test.
        monkeypatch.setitem(precision.PRECISIONS, toy.name, toy)

    resolved = config.resolve(sets=["model.name=tiny", "train.precision=fp64"])
    assert resolved.data.dtype == "float64"
    with pytest.raises(ConfigError, match="one of: fp32, bf16, fp16, fp64, fp16_scaled, auto"):
        config.resolve(sets=["train.precision=fp8"])
    model = factory.create_run_model(resolved, 3, 8, "fp64")
    logits = model(np.ones((2, 8, 8, 3)), training=False)
    assert model.compute_dtype == "float64"
    # The head computes in float32 in every precision; the rest in float64, weights too.
    assert logits.dtype == "float32"
    body = [variable.dtype for variable in model.weights if "/logits/" not in variable.path]
    assert body and set(body) == {"float64"}
    with pytest.raises(ConfigError, match="train.precision=fp16_scaled: its loss scale"):
        config.resolve(sets=["train.precision=fp16_scaled", "sync.mode=model_average"])
    assert config.resolve(sets=["train.precision=fp64", "sync.mode=model_average"])
