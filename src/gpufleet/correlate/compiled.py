"""Which of the correlation engine's modules a compiled build turns into C extensions, and whether
this process runs them compiled (decision 0109).

A release wheel built with ``GPUFLEET_COMPILE=1`` (``make wheel-compiled``) compiles :data:`MODULES`
with mypyc, from the same source files: same code, same numbers, without the interpreter's per-line
overhead. An editable (development) install and a plain wheel run them as Python. Nothing here
imports them: :func:`status` only asks the import system where each would be loaded from.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util

# What the engine runs per event and per evaluation of its verdicts (the set cover, a suspect's action
# and reason): perf at 131,072 GPUs, docs/benchmarks.md §correlate. Not the evaluation harness
# (scenarios, weak, scoring), which runs once per evaluation.
MODULES: tuple[str, ...] = (
    "gpufleet.correlate.candidates",
    "gpufleet.correlate.coherence",
    "gpufleet.correlate.describe",
    "gpufleet.correlate.engine",
    "gpufleet.correlate.explain",
    "gpufleet.correlate.index",
    "gpufleet.correlate.inventory",
    "gpufleet.correlate.kept",
    "gpufleet.correlate.model",
    "gpufleet.correlate.offenders",
    "gpufleet.correlate.rates",
    "gpufleet.correlate.symptoms",
    "gpufleet.correlate.tails",
    "gpufleet.correlate.verdicts",
)


def status() -> dict[str, bool]:
    """For each of :data:`MODULES`: whether it would be (or was) loaded from a compiled extension."""
    out: dict[str, bool] = {}
    for name in MODULES:
        spec = importlib.util.find_spec(name)
        out[name] = spec is not None and isinstance(spec.loader, importlib.machinery.ExtensionFileLoader)
    return out


def describe() -> str:
    """One word for logs and benchmark results: ``compiled`` / ``python`` / ``partly compiled (...)``."""
    st = status()
    if all(st.values()):
        return "compiled"
    if not any(st.values()):
        return "python"
    return "partly compiled (python: " + ", ".join(n.rsplit(".", 1)[1] for n, c in st.items() if not c) + ")"
