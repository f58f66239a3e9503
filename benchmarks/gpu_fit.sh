#!/usr/bin/env bash
# Issue 41, item 5: the main job's in-fit rate against `kmp bench`'s on
# one lent GPU (target >= 0.90; 0.83-0.85 on the 2026-11-25 H100, when
# kmp's step log and Keras's progress bar made each step wait for the
# last one's logs). Since 2026-11-28 `kmp train` passes only async-safe
# callbacks, so Keras on JAX overlaps the host's work with the device's.
#
#   1. `kmp bench --models cifar10` (GPU sizes: width 64, batch 512),
#      each variant's images/s, no per-variant memory processes;
#   2. `kmp train cifar10 --data=synthetic --policy=mixed_float16`, 3
#      epochs: `examples_per_s` in its results.json (the median step
#      from kmp's StepLog) over the bench's fp16+kmp row is the rate;
#   3. (item 5) Keras on torch with kmp against torch.amp on ResNet-9
#      (torch_amp.py, eager; 0.187x in float16 on the 2026-11-27 H200),
#      with kmp's fused BatchNormalization (since 2026-11-28) and with
#      Keras's, in one process, and the aten calls of each step;
#   4. (item 1) kmp's float8 matmul on torch, torch._scaled_mm, against
#      bfloat16 on float8_matmul.py's stack (4 square kernels, 8192
#      rows; eager, Keras's default on torch) at 4096 and 8192: its first
#      GPU measurement (the device has PyTorch with CUDA);
#   5. fit_overlap.py with no host delay at the device's size: what the
#      waiting callbacks cost there.
#
# Measured on the H200 on 2026-11-29 (benchmarks/results/h200_2026-11-29b).
# Since then step 4 also times `float8 eager` (the quantization as it
# ran then) beside kmp's compiled quantization, and a sixth step times
# the quantization alone, eager and compiled (float8_quantize_torch.py).
# And `kmp bench` times each round's steady step (kmp.app.bench's
# `time_fit_rounds`, the step StepLog sees), so step 2's rate over step
# 1's compares like with like; step 1's bench.json keeps the whole
# call's as `call_step_time_s`, what it measured on 2026-11-29.
#
# Run after benchmarks/gpu_speed.sh (the speed issue's first call), in
# the same way (../shared/GPU.md):
#
#   OUT=DIR benchmarks/gpu_fit.sh              # GPU sizes
#   OUT=DIR SIZE=small benchmarks/gpu_fit.sh   # checks the script on a CPU
#
# Packs every result into $OUT/results.tgz, steps.txt beside it.
set -u
source "$(dirname "$0")/gpu_common.sh"

if [ "$SIZE" = gpu ]; then
  BENCH=(--size full --rounds 2)
  TRAIN=(--epochs=3)
  OVERLAP=(--width 4096 --batch_size 4096 --steps 50 --host_ms 0 --rounds 3)
  TORCH_FLOAT8=(--size 4096,8192 --tokens 8192 --steps 10 --rounds 3)
  TORCH_AMP=(--size full --steps 10 --rounds 3)
  QUANTIZE=(--size 8192 --steps 10 --rounds 5)
  LIMITS=(130 80 70 90 50 60)
else
  BENCH=(--size small --steps 2 --rounds 2)
  TRAIN=(--epochs=2 --steps=2 --batch_size=32 --synthetic_size=256)
  OVERLAP=(--width 64 --steps 5 --host_ms 1 --rounds 2)
  TORCH_FLOAT8=(--size 128 --tokens 256 --steps 2 --rounds 2)
  TORCH_AMP=(--size tiny --steps 2 --rounds 2)
  QUANTIZE=(--size 256 --steps 2 --rounds 2)
  LIMITS=(300 300 300 300 300 300)
fi

step bench "${LIMITS[0]}" "$PYTHON" -m kmp_cli bench --models cifar10 \
  --no-memory "${BENCH[@]}" --output "$OUT/bench"

step train_cifar10 "${LIMITS[1]}" "$PYTHON" -m kmp_cli train cifar10 \
  --data=synthetic --policy=mixed_float16 "${TRAIN[@]}" \
  --output_dir="$OUT/train_cifar10"
rm -f "$OUT"/train_cifar10/*.keras  # large, and nothing to read

step torch_amp "${LIMITS[2]}" env KERAS_BACKEND=torch "$PYTHON" \
  benchmarks/torch_amp.py "${TORCH_AMP[@]}" --out "$OUT/torch_amp_full.json"

step float8_matmul_torch "${LIMITS[3]}" env KERAS_BACKEND=torch "$PYTHON" \
  benchmarks/float8_matmul_torch.py "${TORCH_FLOAT8[@]}" \
  --out "$OUT/float8_matmul_torch.json"

step fit_overlap "${LIMITS[4]}" "$PYTHON" benchmarks/fit_overlap.py \
  "${OVERLAP[@]}" --output "$OUT/fit_overlap_jax.json"

step float8_quantize_torch "${LIMITS[5]}" env KERAS_BACKEND=torch "$PYTHON" \
  benchmarks/float8_quantize_torch.py "${QUANTIZE[@]}" \
  --out "$OUT/float8_quantize_torch.json"

tar -czf "$OUT.tgz" -C "$OUT" . && find "$OUT" -type f ! -name steps.txt -delete \
  && mv "$OUT.tgz" "$OUT/results.tgz"
