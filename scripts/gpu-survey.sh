#!/usr/bin/env bash
# What only a real GPU can show, in one pass (about 6 minutes on one H100), written to $1 (default ./gpu-survey):
#   smi.txt          nvidia-smi -q and the topology matrix
#   survey.json      scripts/nvml_survey.py: every agent NVML field, what is NOT_SUPPORTED, cost per read
#   checks.json      python -m bench checks --quick: quick level vs. its budget, GEMM/copy vs. same-run ceilings
#   check_full.json  gpufleet check --level full with a short soak (every check at full size)
#   tiny_gpt.json    examples/tiny_gpt in bf16 for 60 steps, then gpufleet goodput report --json (MFU)
#   agent.txt        gpufleet agent --device nvml --no-push: CPU share and RSS over the run, and its /metrics
#   log.txt          everything the steps printed
# Needs the package importable (pip install -e . or PYTHONPATH=src) and torch with CUDA. Each step is time-
# boxed and a failing step does not stop the next. See docs/benchmarks.md for the recorded results.
DEFAULT_OUT=gpu-survey
# shellcheck source=scripts/gpu-lib.sh
. "$(dirname "$0")/gpu-lib.sh"

identify
{ nvidia-smi topo -m; nvidia-smi nvlink -s; } >> "$OUT_DIR/smi.txt" 2>&1

step "agent (background)"
STATE=$(mktemp -d)
"$PY" -m gpufleet.cli agent --device nvml --no-push --node gpu-survey --state-dir "$STATE" \
  --metrics-port 9400 --metrics-addr 127.0.0.1 --duration 900 >> "$LOG" 2>&1 &
AGENT=$!
AGENT_T0=$(date +%s.%N)

step "NVML field survey"
timeout 60 "$PY" scripts/nvml_survey.py --reads 20 > "$OUT_DIR/survey.json" 2>> "$LOG"

step "checks: quick level and ceilings"
timeout 150 "$PY" -m bench checks --quick >> "$LOG" 2>&1
cp bench/results/checks.json "$OUT_DIR/checks.json" 2>> "$LOG"

step "training example: tiny GPT, bf16"
RUN=$(mktemp -d)
# shellcheck disable=SC2086  # TRAIN_ARGS is a list of options
timeout 120 "$PY" examples/tiny_gpt/train.py --run-dir "$RUN" --ckpt-every 1000 --dtype bf16 \
  ${TRAIN_ARGS:---steps 60 --batch 16 --seq 1024 --d-model 1536 --layers 12 --heads 12 --vocab 32000} \
  --peak-flops "${PEAK_FLOPS:-989.4e12}" >> "$LOG" 2>&1
timeout 60 "$PY" -m gpufleet.cli goodput report "$RUN" --json > "$OUT_DIR/tiny_gpt.json" 2>> "$LOG"

step "checks: full level, 20 s soak"
timeout 150 "$PY" -m gpufleet.cli check --level full --soak "${SOAK:-20s}" --json > "$OUT_DIR/check_full.json" 2>> "$LOG"

step "agent cost"
{
  if kill -0 "$AGENT" 2>/dev/null; then
    "$PY" - "$AGENT" "$AGENT_T0" <<'EOF'
import os, sys, time, urllib.request
pid, t0 = sys.argv[1], float(sys.argv[2])
f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
cpu = (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
wall = time.time() - t0
print(f"agent wall_s {wall:.1f} cpu_s {cpu:.2f} cpu_share_pct {100 * cpu / wall:.2f}")
print("".join(l for l in open(f"/proc/{pid}/status") if l.startswith(("VmRSS", "VmHWM"))), end="")
print("--- /metrics")
body = urllib.request.urlopen("http://127.0.0.1:9400/metrics", timeout=10).read().decode()
print("".join(l + "\n" for l in body.splitlines() if not l.startswith("#")), end="")
EOF
    kill "$AGENT"
  else
    echo "agent exited early; see log.txt"
  fi
} > "$OUT_DIR/agent.txt" 2>&1
wait "$AGENT" 2>/dev/null
step "done"
