#!/usr/bin/env bash
# What one lent GPU measures, most wanted first, each step bounded so that
# a step that runs long leaves the ones after it their time:
#
#   1. kmp.float8 against bfloat16 and Keras's float8 (float8_speed.py);
#   2. the main job end to end, `kmp train cifar10 --data=synthetic`, with
#      a cold and then a warm XLA compile cache;
#   3. `kmp bench` (float32 against mixed precision on the example models).
#
# Run on the device machine through Keras's JAX backend (../shared/GPU.md:
# no TensorFlow there), from the repository root:
#
#   OUT=DIR benchmarks/gpu_session.sh            # GPU sizes
#   OUT=DIR SIZE=small benchmarks/gpu_session.sh  # checks the script on a CPU
#
# Writes each step's JSON, log and wall time under $OUT.
set -u
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

if [ "$SIZE" = gpu ]; then
  FLOAT8=(--steps 10 --rounds 3)
  TRAIN=(--epochs=6)
  BENCH=(--size full --rounds 3)
else
  FLOAT8=(--size small --steps 2 --rounds 2)
  TRAIN=(--epochs=2 --steps=2 --batch_size=32 --synthetic_size=256)
  BENCH=(--size small --steps 2 --rounds 2)
fi

step float8_speed 180 "$PYTHON" benchmarks/float8_speed.py "${FLOAT8[@]}" \
  --out "$OUT/float8_speed_jax.json"

for cache in cold warm; do
  step "train_cifar10_$cache" 90 "$PYTHON" -m kmp_cli train cifar10 \
    --data=synthetic --policy=mixed_float16 "${TRAIN[@]}" \
    --compile_cache="$OUT/xla_cache" --output_dir="$OUT/train_cifar10_$cache"
done
# Compiled executables and the saved models: large, and nothing to read.
rm -rf "$OUT/xla_cache" "$OUT"/train_cifar10_*/*.keras

step bench 290 "$PYTHON" -m kmp_cli bench "${BENCH[@]}" --output "$OUT/bench"
