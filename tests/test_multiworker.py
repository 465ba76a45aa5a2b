"""Two workers on 127.0.0.1 (MultiWorkerMirroredStrategy) end with identical weights."""

import dataclasses
import hashlib
import json
import os
import socket
import subprocess
import sys
import tempfile

import numpy as np

from resnet_app import config
from resnet_app.engine import loop
from tests.commands import error_line, start_code
from tests.runs import read_records, saved_tensors

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

WORKER = """
import sys
import numpy as np
from tensorflow.python.eager import cancellation

from resnet_app import config
from resnet_app.engine import loop

model_dir, data_dir, out, steps, *extra_sets = sys.argv[1:]
resolved = config.resolve(
    sets=[
        "model.name=tiny",
        f"data.data_dir={data_dir}",
        "data.train_examples=64",
        "data.eval_examples=21",
        "train.batch_size=16",
        f"train.train_steps={steps}",
        "train.log_every=2",
        "model.bn_synchronized=true",
        *extra_sets,
    ]
)
result = loop.train_and_evaluate(resolved, model_dir)
# Read across replicas (a mean with model averaging), and this worker's own copy.
local = {
    f"local_{index}": v.value.distribute_strategy.experimental_local_results(v.value)[0]
    for index, v in enumerate(result.model.weights)
}
np.savez(out, *result.model.get_weights(), examples=result.summary["num_examples"], **local)
# Each call's cancellation manager outlives it: a stalled peer cannot crash this survivor.
assert len(getattr(cancellation.context, "keeps", ())) > 0, "keep_call_cancellation is off"
"""


def _free_ports(count):
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def run_workers(tmp_path, steps, *sets):
    """Trains `steps` steps on 2 workers in tmp_path/run; returns their weights.

    `sets` are config assignments ("section.key=value") added to the run's.
    """
    workers = [f"127.0.0.1:{port}" for port in _free_ports(2)]
    processes = []
    for index in range(2):
        tf_config = {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}
        processes.append(
            start_code(
                WORKER,
                str(tmp_path / "run"),
                str(tmp_path / "data"),
                str(tmp_path / f"weights{index}.npz"),
                str(steps),
                *sets,
                env={"TF_CONFIG": json.dumps(tf_config)},
                merged=True,
            )
        )
    for process in processes:
        output, _ = process.communicate(timeout=300)
        assert process.returncode == 0, output[-3000:]
    return [np.load(tmp_path / f"weights{i}.npz") for i in range(2)]


EMA = "train.ema_decay=0.5"  # The moving average of the weights is carried along.
# 0.1 throughout, whatever the length: the runs lengthened on resume compare
# with uninterrupted ones of the final length.
CONSTANT = "schedule.name=constant"


def _assert_same_average(workers_checkpoint, towers_checkpoint):
    """The workers' moving average of the weights is the towers' (as their weights are)."""
    workers, towers = saved_tensors(workers_checkpoint), saved_tensors(towers_checkpoint)
    names = [name for name in towers if name.startswith("ema/")]
    assert names and set(names) == {name for name in workers if name.startswith("ema/")}
    for name in names:
        np.testing.assert_allclose(workers[name], towers[name], rtol=1e-3, atol=2e-5, err_msg=name)


def test_two_workers_end_with_identical_weights_and_resume(tmp_path):
    os.makedirs(tmp_path / "run")
    # Read by the chief at step 2; every worker must follow it.
    (tmp_path / "run" / "lr_override").write_text("x0.5")
    chief, other = run_workers(tmp_path, 4, EMA, CONSTANT)
    assert len(chief.files) > 2
    for name in chief.files:
        np.testing.assert_array_equal(chief[name], other[name], err_msg=name)
    # Both workers evaluated all 21 examples together, each counted once.
    assert int(chief["examples"]) == 21
    # Only the chief wrote the run's files.
    records = read_records(tmp_path / "run")
    assert sum("top1" in r for r in records) == 1
    assert [r["learning_rate"] for r in records if "accuracy" in r] == [0.1, 0.05]

    # The same run in one process on 2 towers: the workers' update is the
    # towers' update (synchronized BatchNorm makes them comparable).
    resolved = config.resolve(
        sets=[
            "model.name=tiny",
            f"data.data_dir={tmp_path / 'data'}",
            "data.train_examples=64",
            "data.eval_examples=21",
            "train.batch_size=16",
            "train.log_every=2",
            "model.bn_synchronized=true",
            EMA,
            CONSTANT,
        ],
        overrides={"train": {"train_steps": 4, "num_towers": 2}},
    )
    os.makedirs(tmp_path / "one")
    (tmp_path / "one" / "lr_override").write_text("x0.5")
    reference = loop.train_and_evaluate(resolved, str(tmp_path / "one")).model.get_weights()
    for index, expected in enumerate(reference):
        np.testing.assert_allclose(chief[f"arr_{index}"], expected, rtol=1e-3, atol=2e-5)
    assert sorted(p.name for p in (tmp_path / "run").glob("ckpt-4.index")) == ["ckpt-4.index"]
    _assert_same_average(tmp_path / "run" / "ckpt-4", tmp_path / "one" / "ckpt-4")

    # Both workers resume from the chief's checkpoint of step 4 and go on to 6,
    # as the one-process run does.
    chief, other = run_workers(tmp_path, 6, EMA, CONSTANT)
    for name in chief.files:
        np.testing.assert_array_equal(chief[name], other[name], err_msg=name)
    starts = [r["step"] for r in read_records(tmp_path / "run") if r.get("event") == "start"]
    assert starts == [0, 4]
    resolved = dataclasses.replace(
        resolved, train=dataclasses.replace(resolved.train, train_steps=6)
    )
    reference = loop.train_and_evaluate(resolved, str(tmp_path / "one")).model.get_weights()
    for index, expected in enumerate(reference):
        np.testing.assert_allclose(chief[f"arr_{index}"], expected, rtol=1e-3, atol=2e-5)
    _assert_same_average(tmp_path / "run" / "ckpt-6", tmp_path / "one" / "ckpt-6")
    # The other worker's scratch checkpoints are gone.
    run = hashlib.sha1(str(tmp_path / "run").encode()).hexdigest()[:12]
    scratch = os.path.join(tempfile.gettempdir(), f"resnet_app_{os.getuid()}_{run}_worker1")
    assert not os.path.exists(scratch)


def worker_environments(**extra):
    """The environments of 2 workers on free 127.0.0.1 ports (TF_CONFIG), plus `extra`."""
    workers = [f"127.0.0.1:{port}" for port in _free_ports(2)]
    return [
        {
            **os.environ,
            "TF_CONFIG": json.dumps(
                {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}
            ),
            "TF_CPP_MIN_LOG_LEVEL": "2",
            "PYTHONPATH": REPO,
            **extra,
        }
        for index in range(2)
    ]


def test_num_gpus_with_tf_config_is_not_silently_ignored(tmp_path):
    """`NUM_GPUS=2 scripts/imagenet_resnet50.sh` (--num_towers=2) on 2 workers.

    MultiWorkerMirroredStrategy takes every local GPU unless told otherwise
    and runs one replica on a CPU-only worker, so --num_towers used to be
    ignored here. These workers have no GPU: 2 towers cannot be honoured,
    and each worker refuses in one line before it touches the run directory.
    """
    script = os.path.join(REPO, "scripts", "imagenet_resnet50.sh")
    # ImageNet's manual files seem to be there, so that the dataset is not what is refused.
    manual = tmp_path / "data" / "downloads" / "manual"
    manual.mkdir(parents=True)
    (manual / "ILSVRC2012_img_train.tar").write_bytes(b"")
    environments = worker_environments(
        NUM_GPUS="2",
        MODEL_DIR=str(tmp_path / "run"),
        DATA_DIR=str(tmp_path / "data"),
        PYTHON=sys.executable,
    )
    processes = [
        subprocess.Popen(
            [script],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for env in environments
    ]
    for process in processes:
        output, errors = process.communicate(timeout=300)
        line = error_line(
            subprocess.CompletedProcess(process.args, process.returncode, output, errors)
        )
        assert line.startswith(
            "error: --num_towers=2 with TF_CONFIG: a CPU-only worker runs one replica"
        ), line
        assert "drop --num_towers" in line
    assert not (tmp_path / "run").exists()
