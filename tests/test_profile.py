"""`train.profile_steps` and `benchmark.py limit`'s reading of the trace it writes."""

import os
import sys

import numpy as np
import pytest

from resnet_app.common import checkpoint, run_dir
from tests import runs
from tests.commands import REPO

sys.path.insert(0, os.path.join(REPO, "scripts"))

import step_limit  # noqa: E402

CONV, BN, IDLE = step_limit.KINDS[0][0], step_limit.KINDS[1][0], step_limit.IDLE


def test_overlapping_ops_share_their_moments_and_the_rest_is_idle():
    events = [(0, 10, CONV), (5, 15, BN), (12, 14, CONV), (20, 30, BN)]
    found = step_limit.shares(events, 0, 40)
    # 0-5 conv; 5-10 both; 10-12 bn; 12-14 both; 14-15 bn; 15-20 idle; 20-30 bn; 30-40 idle.
    assert found[CONV] == 5 + 2.5 + 1 and found[BN] == 2.5 + 2 + 1 + 1 + 10
    assert found[IDLE] == 15 and sum(found.values()) == 40


@pytest.mark.parametrize(
    "name, kind",
    [
        (
            "gradient_tape/resnet/stage1/conv/Conv2DBackpropFilter:_MklNativeConv2DBackpropFilter",
            CONV,
        ),
        ("resnet/logits/BiasAdd:_MklNativeFusedMatMul", CONV),
        ("resnet/stage1/bn/FusedBatchNormV3:_MklNativeFusedBatchNormEx", BN),
        ("gradient_tape/resnet/stage1/ReluGrad:ReluGrad", "ReLU"),
        ("resnet/stage1/add:AddV2", "adds"),
        ("while/momentum/mul_3:Mul", "optimizer and variables"),
        ("while/cond/Square_15:Square", step_limit.OTHER),
    ],
)
def test_an_op_is_of_its_kind(name, kind):
    assert step_limit.kind_of(name) == kind


@pytest.mark.usefixtures("op_determinism_off_after")
def test_a_profiled_run_traces_its_steps_and_trains_bit_for_bit_alike(tmp_path):
    from resnet_app.engine import loop

    dirs = {}
    for profile_steps in (0, 3):  # Steps 4-6 of 6, between the evaluations at 3 and 6.
        resolved = runs.small_config(
            tmp_path,
            train_steps=6,
            log_every=3,
            eval_every=3,
            deterministic=True,
            profile_steps=profile_steps,
        )
        dirs[profile_steps] = str(tmp_path / f"run{profile_steps}")
        loop.train_and_evaluate(resolved, dirs[profile_steps])
    assert not os.path.exists(os.path.join(dirs[0], run_dir.PROFILE_DIR))
    plain, profiled = (
        runs.saved_tensors(checkpoint.list_checkpoints(d)[-1][1]) for d in dirs.values()
    )
    assert set(plain) == set(profiled)
    for name in set(plain) - {"config/.ATTRIBUTES/VARIABLE_VALUE"}:  # It names the setting.
        np.testing.assert_array_equal(profiled[name], plain[name], err_msg=name)
    profile = os.path.join(dirs[3], run_dir.PROFILE_DIR)
    # Every op is the compiled loop's: nothing of the evaluations at either end.
    names = [name for _, _, name in step_limit.op_events(profile)]
    assert names and all(name.startswith("while/") for name in names), sorted(set(names))[:5]
    events, start, stop = step_limit.read_trace(profile)
    kinds = [kind for _, _, kind in events]
    # The same convolutions in each of the 3 steps.
    assert kinds.count(CONV) > 0 and kinds.count(CONV) % 3 == 0 and kinds.count(BN) % 3 == 0
    parts = step_limit.breakdown(dirs[3], 3)
    assert sum(parts.values()) == pytest.approx((stop - start) / 1e9 / 3)
