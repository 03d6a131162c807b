"""Scheduler adapters (sim, slurm, ...) behind one Protocol: ``gpufleet.schedulers.port.Scheduler``."""
