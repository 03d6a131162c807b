"""Collectors: GPU (through the device port), InfiniBand sysfs, kernel log, host (EDAC, mounts)."""
