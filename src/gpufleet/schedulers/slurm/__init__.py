"""The Slurm adapter: the scheduler port over ``scontrol``, ``sinfo --json``, ``squeue --json`` and
(for reads) slurmrestd. See docs/slurm.md."""

from gpufleet.schedulers.slurm.adapter import SlurmScheduler
from gpufleet.schedulers.slurm.runner import CommandResult, CommandRunner, SubprocessRunner

__all__ = ["CommandResult", "CommandRunner", "SlurmScheduler", "SubprocessRunner"]
