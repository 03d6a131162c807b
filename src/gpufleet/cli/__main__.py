"""``python -m gpufleet.cli``."""

from gpufleet.cli import main

main()
