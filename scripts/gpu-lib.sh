# Sourced by scripts/gpu-survey.sh and scripts/gpu-bars.sh: the output folder ($1, else $DEFAULT_OUT), its
# log, the Python to run ($PYTHON, else python3), a timestamped step line, and the GPU's identity.
set -u
OUT_DIR=${1:-$DEFAULT_OUT}
mkdir -p "$OUT_DIR"
LOG="$OUT_DIR/log.txt"
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
step() { echo "=== $(date -u +%H:%M:%S) $*" | tee -a "$LOG"; }

# nvidia-smi's report to smi.txt, and torch's view of the GPU to the log
identify() {
  step "nvidia-smi"
  nvidia-smi -q > "$OUT_DIR/smi.txt" 2>&1
  "$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0))' >> "$LOG" 2>&1
}
