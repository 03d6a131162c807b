"""``python -m gpufleet``: the same command line as ``gpufleet`` (and ``python -m gpufleet.cli``)."""

from gpufleet.cli import main

main()
