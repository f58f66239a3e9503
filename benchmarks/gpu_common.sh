# What every lent-GPU script shares (sourced, not run): $OUT checked and
# made, the JAX backend, `kmp.examples` reachable from an uninstalled
# checkout, `step` (a bounded, logged, timed command), the GPU's name.
: "${OUT:?set OUT to the folder the results go to}"
SIZE=${SIZE:-gpu}
PYTHON=${PYTHON:-python3}
export KERAS_BACKEND=jax
mkdir -p "$OUT"
# `kmp.examples` is examples/ as `pip install` maps it; on the device
# machine kmp runs from PYTHONPATH, uninstalled, so a link stands in.
"$PYTHON" -c "import kmp.examples" 2>/dev/null || ln -sfn "$PWD/examples" kmp/examples

# The whole script's seconds. A device call ends at 600 s, and the
# install before the script and the archive after it come out of that: a
# script whose steps' limits add up to more would be killed before it
# packs what it measured. `step` cuts each limit to what is left, and
# skips a step that would get under 30 s. On a CPU (SIZE=small) the
# scripts check themselves, with no call's limit.
if [ "$SIZE" = gpu ]; then BUDGET=${BUDGET:-540}; else BUDGET=${BUDGET:-100000}; fi
SCRIPT_START=$(date +%s)

step() {  # step NAME SECONDS COMMAND...: runs it, logs it, records its wall time
  local name=$1 limit=$2
  shift 2
  local start end rc left
  left=$((BUDGET - ($(date +%s) - SCRIPT_START)))
  if [ "$left" -lt 30 ]; then
    echo "$name skipped: ${left} s of the script's ${BUDGET} s left" | tee -a "$OUT/steps.txt"
    return
  fi
  if [ "$limit" -gt "$left" ]; then limit=$left; fi
  start=$(date +%s.%N)
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1 &
  local group=$!
  wait "$group"
  rc=$?
  # At the limit `timeout` TERMs its process group (it leads one), but it
  # ends with the benchmark, and a `kmp train` the benchmark started may
  # still be saving its backup, beside the next step: the group ends
  # here.
  kill -KILL -- "-$group" 2>/dev/null
  end=$(date +%s.%N)
  echo "$name rc=$rc wall_s=$(awk "BEGIN{print $end - $start}")" | tee -a "$OUT/steps.txt"
}

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv \
  >"$OUT/gpu.csv" 2>&1 || echo "no nvidia-smi" >"$OUT/gpu.csv"
