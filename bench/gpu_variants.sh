#!/usr/bin/env bash
# The GPU variants of issue 51 (point 3) as one prepared script, for a session lent a GPU machine
# (the device tool's `run`; CI never runs it). It writes everything under $OUT (default runs/gpu):
#
#   crossover.json       bench/device_crossover.py, full sweep: the model size at which CUDA
#                        overtakes the CPU for scoring and for training (CPU at 1 thread, as a site)
#   digits-cuda.json     summary.json of scenarios/digits-label-skew.yaml, 5 trials, sites scoring on
#                        CUDA (model.device: cuda), over site processes
#   fedtype-cuda.json    summary.json of scenarios/fedtype-digits.yaml, 3 rounds, sites trained on CUDA
#   fedtype-cpu.json     the same on the CPU, for the ratio (the same machine, the same call)
#   log.txt              every command's output, with wall times
#
# The GPU machine lacks some of our packages; carry them as wheels (docs/scale.md "CPU or GPU"
# gives the download command) in .whl/, named in `carry`. On a machine without CUDA the script
# still runs (the crossover says "unmeasured", the CUDA runs are skipped): CI-free, but checkable.
set -u
OUT=${OUT:-runs/gpu}
mkdir -p "$OUT"
PY=${PY:-python3}
if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site:${PYTHONPATH:-} || { echo "wheel install failed" >&2; exit 1; }
fi
export PYTHONUNBUFFERED=1
log() { echo "== $(date -u +%H:%M:%S) $*" | tee -a "$OUT/log.txt"; }
timed() {  # name, command...: run, log its output and wall time
  local name=$1; shift
  local start=$SECONDS
  log "$name: $*"
  "$@" >>"$OUT/log.txt" 2>&1; local rc=$?
  log "$name: rc $rc in $((SECONDS - start)) s"
  return $rc
}
CUDA=$($PY -c "import torch; print(int(torch.cuda.is_available()))" 2>>"$OUT/log.txt" || echo 0)
$PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(),
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')" | tee -a "$OUT/log.txt"
nproc | sed 's/^/cpus /' | tee -a "$OUT/log.txt"

timed crossover $PY bench/device_crossover.py --out "$OUT/crossover.json"
if [ "$CUDA" = 1 ]; then
  timed digits-cuda $PY run.py run scenarios/digits-label-skew.yaml --out "$OUT/runs/digits-cuda" \
    --set trials=5 --set model.device=cuda \
    && cp "$OUT/runs/digits-cuda/summary.json" "$OUT/digits-cuda.json"
  for dev in cuda cpu; do
    timed fedtype-$dev $PY run.py run scenarios/fedtype-digits.yaml --backend inprocess \
      --out "$OUT/runs/fedtype-$dev" --set "methods.*.rounds=3" --set "methods.*.device=$dev" \
      && cp "$OUT/runs/fedtype-$dev/summary.json" "$OUT/fedtype-$dev.json"
  done
else
  log "no CUDA: the CUDA runs are skipped"
fi
rm -rf "$OUT/runs"  # the device tool brings back files at most two folders down, 8 in all
log done
