from __future__ import annotations

import pytest

from gpufleet.checks.launch import DEFAULT_PORT, first_host, injected_delay, launch_env
from gpufleet.domain.errors import InvalidInput


def test_torchrun_environment() -> None:
    env = {
        "RANK": "5",
        "WORLD_SIZE": "16",
        "LOCAL_RANK": "5",
        "LOCAL_WORLD_SIZE": "8",
        "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "29400",
    }
    le = launch_env(env, "gpu017")
    assert (le.rank, le.world_size, le.local_rank, le.local_world_size) == (5, 16, 5, 8)
    assert (le.master_addr, le.master_port, le.node, le.launcher) == ("10.0.0.1", 29400, "gpu017", "torchrun")


def test_srun_environment_derives_master_and_port() -> None:
    env = {
        "SLURM_PROCID": "9",
        "SLURM_NTASKS": "16",
        "SLURM_LOCALID": "1",
        "SLURM_TASKS_PER_NODE": "8(x2)",
        "SLURM_JOB_NODELIST": "gpu[007-008]",
        "SLURM_JOB_ID": "123456",
    }
    le = launch_env(env, "gpu008")
    assert (le.rank, le.world_size, le.local_rank, le.local_world_size) == (9, 16, 1, 8)
    assert le.master_addr == "gpu007" and le.master_port == 20000 + 123456 % 10000
    assert le.launcher == "srun"


def test_node_name_override_and_single_process_default() -> None:
    le = launch_env({"GPUFLEET_NODE_NAME": "r01-n03"}, "host")
    assert le.node == "r01-n03" and le.world_size == 1 and le.launcher == "single"
    assert le.master_port == DEFAULT_PORT


@pytest.mark.parametrize(
    ("nodelist", "host"),
    [("gpu[003-010,12]", "gpu003"), ("node1,node2", "node1"), ("a[9]-ib", "a9-ib"), ("cn[001,005]", "cn001")],
)
def test_first_host_of_a_slurm_host_list(nodelist: str, host: str) -> None:
    assert first_host(nodelist) == host


@pytest.mark.parametrize(
    ("env", "field"),
    [
        ({"RANK": "x", "WORLD_SIZE": "2"}, "RANK"),
        ({"RANK": "2", "WORLD_SIZE": "2"}, "RANK"),
        ({"RANK": "0", "WORLD_SIZE": "0"}, "WORLD_SIZE"),
        ({"SLURM_PROCID": "4", "SLURM_NTASKS": "4"}, "SLURM_PROCID"),
        ({"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_TASKS_PER_NODE": "many"}, "SLURM_TASKS_PER_NODE"),
    ],
)
def test_bad_launcher_variables_name_the_variable(env: dict[str, str], field: str) -> None:
    with pytest.raises(InvalidInput) as err:
        launch_env(env, "h")
    assert err.value.field == field


def test_delay_knob() -> None:
    env = {"GPUFLEET_CHECK_TEST_DELAY": "2=0.25,3=1"}
    assert injected_delay(env, 2) == 0.25 and injected_delay(env, 3) == 1.0 and injected_delay(env, 0) == 0.0
    assert injected_delay({}, 2) == 0.0
    with pytest.raises(InvalidInput) as err:
        injected_delay({"GPUFLEET_CHECK_TEST_DELAY": "slow"}, 0)
    assert err.value.expected == "RANK=SECONDS[,RANK=SECONDS]"
