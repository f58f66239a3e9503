#!/usr/bin/env bash
# What one lent GPU measures for issue 41 (float8 that pays, the language
# model near the hardware), most wanted first, each step bounded so that a
# step that runs long leaves the ones after it their time:
#
#   1. kmp's own float8 matmul against bfloat16, forward and backward, on
#      a stack of 4 square kernels at sizes 1024 to 8192, 8192 tokens,
#      with the FP8 GEMMs XLA compiled (float8_matmul.py): where float8
#      starts to pay, and the 8192 stack's ratio (target >= 1.5x);
#   2. the language model (KerasHub's GPT-2, examples/lm.py) at width
#      1024: what `--dropout=0` gets (Keras's own choice of attention,
#      the causal mask as a bias) against the benchmark's causal patch;
#   3. the language model at width 4096, where every kernel is 4096 wide
#      or more (the size from which float8 paid on the 2026-11-27 H200),
#      in bfloat16 and with kmp's float8 matmul (target >= 1.3x);
#   4. `kmp.float8` on the Dense stack and the IMDB encoder at width 2048,
#      Keras's float8 path against kmp's matmul (float8_speed.py);
#   5. Keras on torch with kmp against PyTorch's torch.amp on ResNet-9,
#      eager (torch_amp.py; torch.compile's compiles do not fit here).
#
# On 2026-11-27 (H200) the first version of this script ran out of its
# limits at steps 2 and 4 (benchmarks/results/h200_2026-11-27): the
# steps and variants below are fewer.
#
# Run on the device machine through Keras's JAX backend (../shared/GPU.md:
# no TensorFlow there; KerasHub's wheels, with regex and tokenizers,
# travel in .whl), from the repository root:
#
#   OUT=DIR benchmarks/gpu_speed.sh              # GPU sizes
#   OUT=DIR SIZE=small benchmarks/gpu_speed.sh   # checks the script on a CPU
#
# Writes each step's JSON, log and wall time under $OUT.
set -u
# $OUT, $SIZE, $PYTHON, the JAX backend, `step`, gpu.csv:
source "$(dirname "$0")/gpu_common.sh"

VARIANTS="bf16,bf16+kmp.float8,bf16+kmp.float8(matmul=kmp)"
# lm_speed.py's variants: `+flash` is dropout 0 with Keras's flash
# attention, the mask passed as a bias (what `--dropout=0` runs);
# `+causal` calls it with is_causal and no mask (the benchmark's patch).
FUSED=bf16+flash+causal
if [ "$SIZE" = gpu ]; then
  MATMUL=(--size 1024,2048,4096,8192 --tokens 8192 --steps 10 --rounds 3)
  LM_NARROW=(--configs 1024x16 --steps 5 --rounds 2 --hlo 0)
  LM_WIDE=(--configs 4096x8 --batch_size 8 --steps 3 --rounds 2 --hlo 0)
  FLOAT8=(--steps 10 --rounds 3)
  TORCH=(--size full --steps 10 --rounds 3)
  LIMITS=(100 110 150 130 60)
else
  MATMUL=(--size 128,256 --tokens 256 --steps 2 --rounds 2)
  LM_NARROW=(--size small --steps 2 --rounds 2 --hlo 0)
  LM_WIDE=(--size small --configs 128x1 --steps 2 --rounds 2 --hlo 0)
  FLOAT8=(--size small --steps 2 --rounds 2)
  TORCH=(--size small --steps 2 --rounds 2)
  LIMITS=(300 300 300 600 300)
fi

step float8_matmul "${LIMITS[0]}" "$PYTHON" benchmarks/float8_matmul.py \
  "${MATMUL[@]}" --out "$OUT/float8_matmul_jax.json"

step lm_speed_narrow "${LIMITS[1]}" "$PYTHON" benchmarks/lm_speed.py \
  "${LM_NARROW[@]}" --variants "bf16+flash,$FUSED" \
  --out "$OUT/lm_speed_narrow_jax.json"

step lm_speed_wide "${LIMITS[2]}" "$PYTHON" benchmarks/lm_speed.py \
  "${LM_WIDE[@]}" --variants "$FUSED,$FUSED+kmp.float8" \
  --out "$OUT/lm_speed_wide_jax.json"

step float8_speed "${LIMITS[3]}" "$PYTHON" benchmarks/float8_speed.py \
  "${FLOAT8[@]}" --variants "$VARIANTS" --out "$OUT/float8_speed_jax.json"

step torch_amp "${LIMITS[4]}" env KERAS_BACKEND=torch "$PYTHON" \
  benchmarks/torch_amp.py "${TORCH[@]}" --out "$OUT/torch_amp_full.json"

# The lent machine returns at most 8 files a call: everything in one
# archive, steps.txt beside it to read first.
tar -czf "$OUT.tgz" -C "$OUT" . && find "$OUT" -type f ! -name steps.txt -delete \
  && mv "$OUT.tgz" "$OUT/results.tgz"
