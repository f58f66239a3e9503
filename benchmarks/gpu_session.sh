#!/usr/bin/env bash
# What one lent GPU measures, most wanted first, each step bounded so that
# a step that runs long leaves the ones after it their time:
#
#   0. kmp's own float8 matmul against bfloat16 on a 4 x 8192^2 stack,
#      forward and backward, with the FP8 GEMMs XLA compiled
#      (float8_matmul.py; issue 41's target: >= 1.5x);
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
# $OUT, $SIZE, $PYTHON, the JAX backend, `step`, gpu.csv:
source "$(dirname "$0")/gpu_common.sh"

if [ "$SIZE" = gpu ]; then
  MATMUL=(--steps 10 --rounds 3)
  FLOAT8=(--steps 10 --rounds 3)
  TRAIN=(--epochs=6)
  BENCH=(--size full --rounds 3)
else
  MATMUL=(--size 128 --steps 2 --rounds 2)
  FLOAT8=(--size small --steps 2 --rounds 2)
  TRAIN=(--epochs=2 --steps=2 --batch_size=32 --synthetic_size=256)
  BENCH=(--size small --steps 2 --rounds 2)
fi

step float8_matmul 90 "$PYTHON" benchmarks/float8_matmul.py "${MATMUL[@]}" \
  --out "$OUT/float8_matmul_jax.json"

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
