"""Pure domain types and rules. Imports nothing else from gpufleet and does no I/O."""
