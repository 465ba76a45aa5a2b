"""TF_CONFIG in the shapes Kubernetes operators write it (Kubeflow's TFJob, JobSet by hand).

TFJob lower-cases its replica types into the cluster and adds "environment":
"cloud" (training-operator's `genTFConfigJSONStr`); the evaluator replica is
listed beside the trainers. The two-process runs of these shapes are in
test_slurm.py (a chief, a worker and an evaluator entry, bitwise equal to the
srun pair).
"""

import json

import pytest

from resnet_app.common import tf_config
from resnet_app.common.errors import ConfigError
from tests.commands import error_line, run_command

CHIEF = ["job-chief-0.ns.svc:2222"]
WORKERS = ["job-worker-0.ns.svc:2222", "job-worker-1.ns.svc:2222"]
EVALUATOR = ["job-evaluator-0.ns.svc:2222"]


def tfjob(task_type, index, **cluster):
    return {
        "cluster": cluster,
        "task": {"type": task_type, "index": index},
        "environment": "cloud",
    }


ACCEPTED = [
    # chief + workers (+ evaluator): every training task, for train and evaluate.
    (tfjob("chief", 0, chief=CHIEF, worker=WORKERS), 3),
    (tfjob("worker", 1, chief=CHIEF, worker=WORKERS, evaluator=EVALUATOR), 3),
    # workers only (worker 0 is the chief), as a JobSet or an indexed Job writes it by hand.
    (tfjob("worker", 0, worker=WORKERS), 2),
    (tfjob("worker", 1, worker=WORKERS, evaluator=EVALUATOR), 2),
    # One replica: trains alone.
    (tfjob("chief", 0, chief=CHIEF), 1),
]


@pytest.mark.parametrize("config, tasks", ACCEPTED)
def test_the_training_tasks_of_each_tfjob_shape(config, tasks):
    for command in ("train", "evaluate"):
        tf_config.check(config, command)
    assert tf_config.training_tasks(config) == tasks
    assert not tf_config.is_evaluator(config)


def test_the_evaluator_task_evaluates_and_never_trains():
    config = tfjob("evaluator", 0, chief=CHIEF, worker=WORKERS, evaluator=EVALUATOR)
    assert tf_config.is_evaluator(config)
    tf_config.check(config, "evaluate")
    with pytest.raises(ConfigError, match="makes this task the evaluator, which does not train"):
        tf_config.check(config, "train")


REFUSED = [
    (tfjob("worker", 0, ps=["p:1"], worker=WORKERS), 'has a "ps" job: .* drop the ps replicas'),
    (tfjob("master", 0, master=CHIEF, worker=WORKERS), 'has a "master" job'),
    (tfjob("chief", 0, chief=CHIEF * 2, worker=WORKERS), "names 2 chiefs; a job has at most one"),
    (tfjob("worker", 2, chief=CHIEF, worker=WORKERS), "task is worker 2, but its cluster lists 2"),
    (tfjob("chief", "0", chief=CHIEF, worker=WORKERS), "is not a training task"),
]


@pytest.mark.parametrize("config, message", REFUSED)
def test_shapes_we_cannot_run_are_one_line(config, message):
    with pytest.raises(ConfigError, match=message) as raised:
        tf_config.check(config, "train")
    assert "\n" not in str(raised.value)


def test_the_evaluators_tf_config_given_to_train_is_one_line_before_tensorflow(tmp_path):
    config = tfjob("evaluator", 0, chief=CHIEF, worker=WORKERS, evaluator=EVALUATOR)
    result = run_command(
        "resnet_app.train",
        f"--model_dir={tmp_path / 'run'}",
        "--model=tiny",
        env={"TF_CONFIG": json.dumps(config)},
    )
    assert result.returncode == 2
    line = error_line(result)
    assert line.startswith("error: TF_CONFIG makes this task the evaluator"), line
    assert "resnet-app evaluate --watch" in line
    assert "tensorflow" not in result.stderr.lower()  # Answered before TensorFlow loaded.
    assert not (tmp_path / "run").exists()
