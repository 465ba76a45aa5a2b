"""`srun resnet-app train`: SLURM's task variables become the TF_CONFIG of each task.

A fake `scontrol` first on PATH expands the node list, as the real one does
on a SLURM node. Every expected cluster is written out by hand here.
"""

import json
import logging
import os
import stat
import subprocess

import numpy as np
import pytest

from resnet_app.common import slurm
from resnet_app.common.errors import ConfigError
from resnet_app.common.tf_config import read as read_tf_config
from tests.commands import REPO, blocked_packages, error_line, run_command, start_command
from tests.runs import read_records, saved_tensors
from tests.test_multiworker import _free_ports

SLURM_VARIABLES = (
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "SLURM_STEP_NUM_TASKS",
    "SLURM_STEP_NODELIST",
    "SLURM_STEP_TASKS_PER_NODE",
    "SLURM_STEP_RESV_PORTS",
    "SLURM_JOB_ID",
    "SLURM_LOCALID",
    "SLURMD_NODENAME",
    "SLURM_GPUS_PER_TASK",
    "TF_CONFIG",
)


def write_fake_scontrol(folder, hosts_by_list):
    """A `scontrol` in `folder` that expands the node lists of `hosts_by_list` (else fails)."""
    folder.mkdir(exist_ok=True)
    cases = "".join(
        f"  '{nodelist}') printf '%s\\n' {' '.join(hosts)} ;;\n"
        for nodelist, hosts in hosts_by_list.items()
    )
    script = folder / "scontrol"
    script.write_text(
        "#!/bin/sh\n"
        '[ "$1" = show ] && [ "$2" = hostnames ] || exit 1\n'
        'case "$3" in\n'
        f"{cases}"
        '  *) echo "scontrol: error: bad node list $3" >&2; exit 1 ;;\n'
        "esac\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    nodelist, hosts = next(iter(hosts_by_list.items()))
    printed = subprocess.run(
        [script, "show", "hostnames", nodelist], capture_output=True, text=True, check=True
    ).stdout
    assert printed.split() == hosts, printed
    return folder


@pytest.fixture
def slurm_env(monkeypatch):
    """Sets a SLURM task's variables on an environment without any."""
    for name in (*SLURM_VARIABLES, "CUDA_VISIBLE_DEVICES"):
        # Set, then removed: monkeypatch records the value to put back, so that
        # the TF_CONFIG and CUDA_VISIBLE_DEVICES the code sets do not outlive the test.
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)

    def set_env(**variables):
        for name, value in variables.items():
            monkeypatch.setenv(name, str(value))

    return set_env


@pytest.fixture
def scontrol(tmp_path, monkeypatch):
    """Puts a fake `scontrol` first on PATH that expands the node lists it is given."""

    def install(hosts_by_list):
        bin_dir = write_fake_scontrol(tmp_path / "bin", hosts_by_list)
        monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")

    return install


def exported():
    """What `export_tf_config` sets, and that TF_CONFIG as the environment now holds it."""
    tf_config = slurm.export_tf_config()
    assert json.loads(os.environ["TF_CONFIG"]) == tf_config
    return tf_config


def test_two_nodes_two_tasks_each_job_id_ports(slurm_env, scontrol, caplog):
    scontrol({"node[1-2]": ["node1", "node2"]})
    slurm_env(
        SLURM_NTASKS=4,
        SLURM_STEP_NUM_TASKS=4,
        SLURM_PROCID=2,
        SLURM_LOCALID=0,
        SLURMD_NODENAME="node2",
        SLURM_STEP_NODELIST="node[1-2]",
        SLURM_STEP_TASKS_PER_NODE="2(x2)",
        SLURM_JOB_ID=777,
    )
    assert slurm.check_before_tensorflow()
    # 20000 + (777 % 1596) * 8: the job's block of 8 ports.
    base = 26216
    expected = [f"node1:{base}", f"node1:{base + 1}", f"node2:{base}", f"node2:{base + 1}"]
    with caplog.at_level(logging.INFO, logger="absl"):
        tf_config = exported()
    assert tf_config == {"cluster": {"worker": expected}, "task": {"type": "worker", "index": 2}}
    line = "\n".join(r.getMessage() for r in caplog.records if "SLURM" in r.getMessage())
    assert "SlurmClusterResolver" in line and "rank 2" in line and "of 4" in line, line
    assert "ports from SLURM_JOB_ID=777" in line, line

    # The app's own TF_CONFIG reading, and TensorFlow's, take it as written by hand.
    from resnet_app.common import distribute

    resolver = distribute.worker_resolver(read_tf_config(), None, 0)
    assert resolver.cluster_spec().as_dict() == {"worker": expected}
    assert (resolver.task_type, resolver.task_id) == ("worker", 2)


def test_one_node_four_tasks_reserved_ports(slurm_env, scontrol, caplog):
    scontrol({"gpu07": ["gpu07"]})
    slurm_env(
        SLURM_NTASKS=4,
        SLURM_PROCID=3,
        SLURM_STEP_NODELIST="gpu07",
        SLURM_STEP_TASKS_PER_NODE="4",
        SLURM_STEP_RESV_PORTS="12000-12003",
        SLURM_JOB_ID=5,
    )
    with caplog.at_level(logging.INFO, logger="absl"):
        tf_config = exported()
    assert tf_config == {
        "cluster": {"worker": ["gpu07:12000", "gpu07:12001", "gpu07:12002", "gpu07:12003"]},
        "task": {"type": "worker", "index": 3},
    }
    line = "\n".join(r.getMessage() for r in caplog.records if "SLURM" in r.getMessage())
    assert "ports from SLURM_STEP_RESV_PORTS=12000-12003" in line, line


def test_reserved_ports_as_a_list(slurm_env, scontrol):
    scontrol({"a[1-2]": ["a1", "a2"]})
    slurm_env(
        SLURM_NTASKS=2,
        SLURM_PROCID=0,
        SLURM_STEP_NODELIST="a[1-2]",
        SLURM_STEP_TASKS_PER_NODE="1(x2)",
        SLURM_STEP_RESV_PORTS="12000,12005",
    )
    assert exported() == {
        "cluster": {"worker": ["a1:12000", "a2:12000"]},
        "task": {"type": "worker", "index": 0},
    }


def test_too_few_reserved_ports_is_one_line(slurm_env):
    slurm_env(
        SLURM_NTASKS=2,
        SLURM_PROCID=0,
        SLURM_STEP_NODELIST="n1",
        SLURM_STEP_TASKS_PER_NODE="2",
        SLURM_STEP_RESV_PORTS="12000,12005",
    )
    with pytest.raises(ConfigError) as raised:
        slurm.check_before_tensorflow()
    message = str(raised.value)
    assert "\n" not in message
    assert "SLURM_STEP_RESV_PORTS=12000,12005" in message and "2 consecutive ports" in message


def test_two_jobs_on_one_node_take_different_ports(slurm_env, scontrol):
    clusters = []
    for job_id in (41, 42):
        scontrol({"n1": ["n1"]})
        slurm_env(
            SLURM_NTASKS=8,
            SLURM_PROCID=0,
            SLURM_STEP_NODELIST="n1",
            SLURM_STEP_TASKS_PER_NODE="8",
            SLURM_JOB_ID=job_id,
        )
        os.environ.pop("TF_CONFIG", None)
        clusters.append(exported()["cluster"]["worker"])
    # 20000 + 41 * 8 and 20000 + 42 * 8: adjacent blocks of 8.
    assert clusters == [
        [f"n1:{port}" for port in range(20328, 20336)],
        [f"n1:{port}" for port in range(20336, 20344)],
    ]
    # A job id of any size stays below the ephemeral range; 9 tasks take two strides.
    for job_id, tasks in ((10**9 + 7, 8), (10**9 + 7, 9), (1595, 8)):
        slurm_env(SLURM_JOB_ID=job_id)
        base, source = slurm.choose_ports(tasks)
        assert base >= 20000 and base + tasks - 1 < 32768, (job_id, tasks, base)
        assert source.startswith(f"SLURM_JOB_ID={job_id}")


PARTIAL = [
    (
        {"SLURM_NTASKS": 2, "SLURM_STEP_NODELIST": "n1", "SLURM_STEP_TASKS_PER_NODE": "2"},
        "SLURM_PROCID",
    ),
    (
        {"SLURM_NTASKS": 2, "SLURM_PROCID": 0, "SLURM_STEP_TASKS_PER_NODE": "2"},
        "SLURM_STEP_NODELIST",
    ),
    (
        {"SLURM_STEP_NUM_TASKS": 2, "SLURM_PROCID": 1, "SLURM_STEP_NODELIST": "n1"},
        "SLURM_STEP_TASKS_PER_NODE",
    ),
    (
        {
            "SLURM_NTASKS": 2,
            "SLURM_PROCID": 1,
            "SLURM_STEP_NODELIST": "n1",
            "SLURM_STEP_TASKS_PER_NODE": "2",
        },
        "SLURM_JOB_ID",
    ),
]


@pytest.mark.parametrize("variables, missing", PARTIAL, ids=[m for _, m in PARTIAL])
def test_partial_environment_names_the_missing_variable(slurm_env, variables, missing):
    slurm_env(**variables)
    with pytest.raises(ConfigError) as raised:
        slurm.check_before_tensorflow()
    message = str(raised.value)
    assert "\n" not in message
    assert f"{missing} is not set" in message and "srun" in message
    assert "TF_CONFIG" not in os.environ


def test_node_list_and_task_counts_that_disagree(slurm_env, scontrol):
    scontrol({"n[1-2]": ["n1", "n2"]})
    slurm_env(
        SLURM_NTASKS=3,
        SLURM_PROCID=0,
        SLURM_STEP_NODELIST="n[1-2]",
        SLURM_STEP_TASKS_PER_NODE="2(x2)",
        SLURM_JOB_ID=1,
    )
    with pytest.raises(ConfigError, match="do not describe the 3 tasks"):
        slurm.check_before_tensorflow()


def test_missing_scontrol_is_one_line(slurm_env, tmp_path, monkeypatch):
    slurm_env(
        SLURM_NTASKS=2,
        SLURM_PROCID=0,
        SLURM_STEP_NODELIST="n[1-2]",
        SLURM_STEP_TASKS_PER_NODE="1(x2)",
        SLURM_JOB_ID=1,
    )
    (tmp_path / "empty").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(ConfigError) as raised:
        slurm.check_before_tensorflow()
    assert str(raised.value).startswith("scontrol is not on PATH")
    assert "SLURM_STEP_NODELIST='n[1-2]'" in str(raised.value)


@pytest.mark.parametrize(
    "variables",
    [
        {"SLURM_NTASKS": 1, "SLURM_PROCID": 0, "SLURM_STEP_NODELIST": "n1", "SLURM_JOB_ID": 3},
        {"SLURM_PROCID": 0, "SLURM_JOB_ID": 3},  # A batch script's own step: no task count.
        {"SLURM_STEP_NUM_TASKS": 1, "SLURM_NTASKS": 4, "SLURM_PROCID": 0},
    ],
    ids=["ntasks=1", "no task count", "one-task step of a bigger job"],
)
def test_single_task_trains_on_its_own(slurm_env, variables):
    slurm_env(**variables)
    assert not slurm.check_before_tensorflow()
    assert slurm.export_tf_config() is None
    assert "TF_CONFIG" not in os.environ


def test_tf_config_wins_over_slurm(slurm_env):
    mine = '{"cluster": {"worker": ["h:1", "h:2"]}, "task": {"type": "worker", "index": 1}}'
    # Even a partial SLURM environment is not read.
    slurm_env(SLURM_NTASKS=4, TF_CONFIG=mine)
    assert not slurm.check_before_tensorflow()
    assert slurm.export_tf_config() is None
    assert os.environ["TF_CONFIG"] == mine


def test_cyclic_placement_takes_the_index_of_its_own_address(slurm_env, scontrol):
    """Rank 1 on n1 (cyclic): its address is n1's second port, the resolver's index 1."""
    scontrol({"n[1-2]": ["n1", "n2"]})
    slurm_env(
        SLURM_NTASKS=4,
        SLURM_PROCID=2,
        SLURM_LOCALID=1,
        SLURMD_NODENAME="n1",
        SLURM_STEP_NODELIST="n[1-2]",
        SLURM_STEP_TASKS_PER_NODE="2(x2)",
        SLURM_STEP_RESV_PORTS="15000-15001",
    )
    assert exported() == {
        "cluster": {"worker": ["n1:15000", "n1:15001", "n2:15000", "n2:15001"]},
        "task": {"type": "worker", "index": 1},
    }


@pytest.mark.parametrize(
    "local_id, gpus_per_task, visible, expected",
    [
        (1, None, "0,1,2,3", "2,3"),  # 2 tasks share a node's 4 GPUs: 2 each.
        (0, None, "4,5,6,7", "4,5"),  # Numbered as CUDA_VISIBLE_DEVICES names them.
        (1, "1", "3", "3"),  # --gpus-per-task: SLURM bound them already.
    ],
)
def test_tasks_share_a_nodes_gpus(slurm_env, scontrol, local_id, gpus_per_task, visible, expected):
    scontrol({"g1": ["g1"]})
    slurm_env(
        SLURM_NTASKS=2,
        SLURM_PROCID=local_id,
        SLURM_LOCALID=local_id,
        SLURMD_NODENAME="g1",
        SLURM_STEP_NODELIST="g1",
        SLURM_STEP_TASKS_PER_NODE="2",
        SLURM_JOB_ID=9,
        CUDA_VISIBLE_DEVICES=visible,
    )
    if gpus_per_task:
        slurm_env(SLURM_GPUS_PER_TASK=gpus_per_task)
    assert slurm.check_before_tensorflow()
    assert os.environ["CUDA_VISIBLE_DEVICES"] == expected


def test_one_task_per_node_keeps_every_gpu_and_a_cpu_node_none(slurm_env, scontrol):
    scontrol({"g[1-2]": ["g1", "g2"]})
    slurm_env(
        SLURM_NTASKS=2,
        SLURM_PROCID=1,
        SLURM_LOCALID=0,
        SLURMD_NODENAME="g2",
        SLURM_STEP_NODELIST="g[1-2]",
        SLURM_STEP_TASKS_PER_NODE="1(x2)",
        SLURM_JOB_ID=9,
        CUDA_VISIBLE_DEVICES="0,1,2,3",
    )
    assert slurm.check_before_tensorflow()
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"
    slurm_env(CUDA_VISIBLE_DEVICES="", SLURM_STEP_TASKS_PER_NODE="2", SLURM_STEP_NODELIST="g1")
    scontrol({"g1": ["g1"]})
    slurm_env(SLURMD_NODENAME="g1")
    assert slurm.check_before_tensorflow()
    assert os.environ["CUDA_VISIBLE_DEVICES"] == ""


def test_more_tasks_than_gpus_is_one_line(slurm_env, scontrol):
    scontrol({"g1": ["g1"]})
    slurm_env(
        SLURM_NTASKS=4,
        SLURM_PROCID=0,
        SLURM_LOCALID=0,
        SLURM_STEP_NODELIST="g1",
        SLURM_STEP_TASKS_PER_NODE="4",
        SLURM_JOB_ID=9,
        CUDA_VISIBLE_DEVICES="0,1",
    )
    with pytest.raises(ConfigError, match="4 tasks on this node share 2 GPU"):
        slurm.check_before_tensorflow()


def test_nothing_set_outlives_a_test():
    """The tests above set TF_CONFIG; none is left for the tests that run after them."""
    assert "TF_CONFIG" not in os.environ


def test_partial_environment_is_answered_before_tensorflow(tmp_path):
    """`resnet-app train` with SLURM_NTASKS=2 but no SLURM_PROCID: one line, exit 2."""
    blocked = blocked_packages(tmp_path / "blocked", "tensorflow")
    result = run_command(
        "resnet_app.train",
        "--model=tiny",
        f"--data_dir={tmp_path / 'data'}",
        f"--model_dir={tmp_path / 'run'}",
        env={"PYTHONPATH": f"{blocked}{os.pathsep}{REPO}", "SLURM_NTASKS": "2"},
        unset=SLURM_VARIABLES,
    )
    line = error_line(result)
    assert line.startswith("error: SLURM runs 2 tasks but SLURM_PROCID is not set"), line
    assert not (tmp_path / "run").exists()


# Deterministic, synchronized BatchNorm: two pairs of workers can agree bitwise.
PAIR_ARGS = (
    "--model=tiny",
    "--set=data.train_examples=64",
    "--set=data.eval_examples=16",
    "--batch_size=16",
    "--train_steps=2",
    "--log_every=1",
    "--deterministic",
    "--set=model.bn_synchronized=true",
)


def start_pair(tmp_path, run, environments):
    """Two `resnet-app train` processes of one run, one per environment."""
    return [
        start_command(
            "resnet_app.train",
            *PAIR_ARGS,
            f"--data_dir={tmp_path / 'data'}",
            f"--model_dir={run}",
            env=env,
            merged=True,
        )
        for env in environments
    ]


def finish(processes, timeout=300):
    outputs = []
    for process in processes:
        output, _ = process.communicate(timeout=timeout)
        outputs.append(output)
        assert process.returncode == 0, output[-3000:]
    return outputs


def test_two_tasks_under_srun_train_as_two_workers_as_a_tfjob_does(tmp_path):
    """Two `resnet-app train` processes with SLURM's variables only: one job of 2 workers.

    The same run as a TFJob writes it (a chief, a worker and an evaluator
    entry; the evaluator task watching) ends bitwise equal.
    """
    bin_dir = write_fake_scontrol(tmp_path / "bin", {"localhost": ["127.0.0.1"]})
    first, _ = _free_ports(2)
    # Two consecutive ports reserved, as srun --resv-ports gives them (free ones here).
    reserved = f"{first}-{first + 1}"
    run = tmp_path / "run"
    environments = [
        {
            "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
            "SLURM_PROCID": str(rank),
            "SLURM_LOCALID": str(rank),
            "SLURM_NTASKS": "2",
            "SLURM_STEP_NODELIST": "localhost",
            "SLURM_STEP_TASKS_PER_NODE": "2",
            "SLURM_STEP_RESV_PORTS": reserved,
            "SLURM_JOB_ID": "4242",
        }
        for rank in range(2)
    ]
    outputs = finish(start_pair(tmp_path, run, environments))
    chief = outputs[0]
    assert "SlurmClusterResolver made this task (rank 0) worker 0 of 2" in chief, chief[-3000:]
    assert f"ports from SLURM_STEP_RESV_PORTS={reserved}" in chief
    assert "Multi-worker: 2 replicas over 2 workers" in chief
    assert "SlurmClusterResolver made this task (rank 1) worker 1 of 2" in outputs[1]
    assert (run / "ckpt-2.index").exists()
    srun = saved_tensors(run / "ckpt-2")
    assert int(srun["num_replicas/.ATTRIBUTES/VARIABLE_VALUE"]) == 2
    records = read_records(run)
    # Only the chief wrote the metrics: one start, one evaluation.
    assert [r["step"] for r in records if r.get("event") == "start"] == [0]
    assert sum("top1" in r for r in records) == 1
    assert np.isfinite([r["loss"] for r in records if "loss" in r]).all()

    # TFJob's shape: chief, worker and evaluator replicas, "environment": "cloud".
    chief_port, worker_port, evaluator_port = _free_ports(3)
    cluster = {
        "chief": [f"127.0.0.1:{chief_port}"],
        "worker": [f"127.0.0.1:{worker_port}"],
        "evaluator": [f"127.0.0.1:{evaluator_port}"],
    }

    def task(kind):
        config = {"cluster": cluster, "task": {"type": kind, "index": 0}, "environment": "cloud"}
        return {"TF_CONFIG": json.dumps(config)}

    tfjob = tmp_path / "tfjob"
    evaluator = start_command(
        "resnet_app.evaluate",
        f"--model_dir={tfjob}",
        "--watch",
        "--watch_every=0.2",
        env=task("evaluator"),
    )
    outputs = finish(start_pair(tmp_path, tfjob, [task("chief"), task("worker")]))
    assert "Multi-worker: 2 replicas over 2 workers (this one: chief 0)" in outputs[0]
    tensors = saved_tensors(tfjob / "ckpt-2")
    assert sorted(tensors) == sorted(srun)
    for name, value in srun.items():
        np.testing.assert_array_equal(tensors[name], value, err_msg=name)
    watched, errors = evaluator.communicate(timeout=300)
    assert evaluator.returncode == 0, errors[-3000:]
    assert "TF_CONFIG makes this task the evaluator" in errors
    [record] = [json.loads(line) for line in watched.splitlines()]
    [trainers] = [r for r in read_records(tfjob) if "top1" in r and "event" not in r]
    assert (record["checkpoint"], record["top1"]) == ("ckpt-2", trainers["top1"])
