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

step() {  # step NAME SECONDS COMMAND...: runs it, logs it, records its wall time
  local name=$1 limit=$2
  shift 2
  local start end rc
  start=$(date +%s.%N)
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
  rc=$?
  end=$(date +%s.%N)
  echo "$name rc=$rc wall_s=$(awk "BEGIN{print $end - $start}")" | tee -a "$OUT/steps.txt"
}

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv \
  >"$OUT/gpu.csv" 2>&1 || echo "no nvidia-smi" >"$OUT/gpu.csv"
