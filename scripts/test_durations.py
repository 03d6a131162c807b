"""Write ``tests/durations.json``: each test group's seconds in one run, for the test scheduler's order.

``make test`` hands the longest groups out first (tests/conftest.py ``SlurmTogether``); it learns how long
each group takes from this file. Refresh it from a CI run's report when tests are added or become slower:

    make test PYTEST_ARGS=--junitxml=/tmp/junit.xml
    .venv/bin/python scripts/test_durations.py /tmp/junit.xml

A group is ``slurm`` (every test in the Slurm lab's worker) or a test file. Groups under ``--min`` seconds
are left out (they count 0.5 s per test, about what most take). Only the order depends on this file: a
stale or missing one makes the run longer, never different.
"""

from __future__ import annotations

import argparse
import json
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def group_seconds(junit: Path) -> dict[str, float]:
    sys.path.insert(0, str(ROOT))
    from tests.conftest import scope_of

    out: dict[str, float] = defaultdict(float)
    for case in ET.parse(junit).iter("testcase"):
        classname, name = case.get("classname", ""), case.get("name", "")
        parts = classname.split(".")
        # classname is the module path, then any test class: find the file
        for i in range(len(parts), 0, -1):
            path = "/".join(parts[:i]) + ".py"
            if (ROOT / path).is_file():
                break
        else:
            raise SystemExit(f"{junit}: no test file for classname {classname!r}")
        out[scope_of(f"{path}::{name}")] += float(case.get("time", "0") or 0)
    return dict(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("junit", type=Path, help="pytest's --junitxml report of a whole `make test` run")
    p.add_argument("--min", type=float, default=3.0, help="leave out groups under this many seconds")
    p.add_argument("--out", type=Path, default=ROOT / "tests" / "durations.json")
    a = p.parse_args()
    seconds = group_seconds(a.junit)
    kept = {k: round(v, 1) for k, v in sorted(seconds.items(), key=lambda kv: -kv[1]) if v >= a.min}
    doc = {"about": "seconds per test group in one `make test` run; scripts/test_durations.py writes it",
           "total_s": round(sum(seconds.values()), 1), "seconds": kept}
    a.out.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    print(f"{a.out}: {len(kept)} of {len(seconds)} groups, {doc['total_s']} s in all")


if __name__ == "__main__":
    main()
