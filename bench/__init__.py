"""Benchmarks. ``make bench`` (``python -m bench``) runs every ``bench/bench_*.py`` module.

Each module defines ``run(quick: bool) -> dict`` returning JSON-serialisable results (always
including side-by-side baselines so the numbers can be read as ratios on a noisy machine). Results
are written to ``bench/results/<name>.json``; ``docs/benchmarks.md`` summarises them by hand.
"""
