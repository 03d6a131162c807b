"""gpufleet: a reliability control plane for GPU training clusters."""

__version__ = "0.1.0"
