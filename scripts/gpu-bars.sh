#!/usr/bin/env bash
# Measure a GPU SKU's check rates against its shipped bars, every run kept (about 4 minutes on one GPU):
#   smi.txt            nvidia-smi -q (clocks, power limit, driver)
#   survey.json        scripts/nvml_survey.py: the agent's NVML fields on this GPU generation
#   ceilings.json      python -m bench checks --quick: the quick level vs. the same run's GEMM/copy ceilings
#   quick-N.json       gpufleet check --level quick --json, QUICK_RUNS times (default 3)
#   full-N.json        gpufleet check --level full --soak SOAK --json, FULL_RUNS times (default 2, 30s)
#   log.txt            everything the steps printed
# written to $1 (default ./gpu-bars). Each report carries every row's rate, its bar and its verdict, so a
# bar a healthy GPU misses shows as a `warn` row (decision 0111 did this for the H100). Needs the package
# importable (pip install -e . or PYTHONPATH=src) and torch with CUDA. Each step is time-boxed and a failing
# step does not stop the next. Results go in docs/benchmarks.md (section checks) and, as rates,
# tests/fixtures/checks/<sku>-healthy-runs.json.
DEFAULT_OUT=gpu-bars
# shellcheck source=scripts/gpu-lib.sh
. "$(dirname "$0")/gpu-lib.sh"

identify

step "NVML field survey"
timeout 60 "$PY" scripts/nvml_survey.py --reads 20 > "$OUT_DIR/survey.json" 2>> "$LOG"

for i in $(seq 1 "${QUICK_RUNS:-3}"); do
  step "quick level, run $i"
  timeout 120 "$PY" -m gpufleet.cli check --level quick --json > "$OUT_DIR/quick-$i.json" 2>> "$LOG"
done

for i in $(seq 1 "${FULL_RUNS:-2}"); do
  step "full level, ${SOAK:-30s} soak, run $i"
  timeout 200 "$PY" -m gpufleet.cli check --level full --soak "${SOAK:-30s}" --json > "$OUT_DIR/full-$i.json" 2>> "$LOG"
done

step "quick level vs. same-run ceilings"
timeout 150 "$PY" -m bench checks --quick >> "$LOG" 2>&1
cp bench/results/checks.json "$OUT_DIR/ceilings.json" 2>> "$LOG"
step "done"
