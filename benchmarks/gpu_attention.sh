#!/usr/bin/env bash
# KerasHub's own decoders told their causal mask and sliding window
# (kmp.islands.attend_causally, kmp.backend.causal_attention) on one lent
# GPU: what the compiled programs showed on a CPU (gpu_compile.py's llama
# and gemma programs: cuDNN's CAUSAL mask type, Gemma 3's window of 512
# in both cuDNN calls from cuDNN 9.10.2) timed, and whether cuDNN takes
# the window there:
#
#   1. hub_attention_speed.py: KerasHub's Llama at width 2048 and Gemma 3
#      in its 1B model's shape, 4 blocks, batch 8 x 1024, each variant's
#      step compiled and its cuDNN calls counted by mask type and window
#      (`pinned`: kmp's; `nowindow`: Gemma without the window told;
#      `hubcausal`: KerasHub's mask alone), then timed interleaved;
#   2. the same Gemma at 4 x 4096 tokens, where the window skips 72 % of
#      the causal 128 x 128 tiles, not a sixth.
#
# After benchmarks/gpu_speed.sh and benchmarks/gpu_fit.sh (issue 41's
# items), in the same way (../shared/GPU.md):
#
#   OUT=DIR benchmarks/gpu_attention.sh              # GPU sizes
#   OUT=DIR SIZE=small benchmarks/gpu_attention.sh   # checks the script on a CPU
set -u
source "$(dirname "$0")/gpu_common.sh"
if [ "$SIZE" = gpu ]; then
  SPEED=(--steps 10 --rounds 3)
  LONG=(--models gemma --batch_size 4 --sequence_length 4096)
  LIMITS=(240 150)
else
  SPEED=(--size small --steps 2 --rounds 2)
  LONG=(--models gemma --sequence_length 128)
  LIMITS=(300 300)
fi
step hub_attention "${LIMITS[0]}" "$PYTHON" benchmarks/hub_attention_speed.py \
  "${SPEED[@]}" --out "$OUT/hub_attention_speed.json"
step hub_attention_long "${LIMITS[1]}" "$PYTHON" \
  benchmarks/hub_attention_speed.py "${SPEED[@]}" "${LONG[@]}" \
  --out "$OUT/hub_attention_speed_long.json"
