#!/usr/bin/env bash
# What one lent GPU measures of the memory modes (issue 32), most wanted
# first, each step bounded so that a step that runs long leaves the ones
# after it their time:
#
#   1. each mode's compiled train step of the language model at width
#      1024 (memory_footprint.py: XLA's analysis, nothing runs), remat
#      included: on a GPU, XLA schedules for memory, on a CPU it does not;
#   2. the modes trained, the same steps and seed (memory_modes.py):
#      tokens/s, the device's peak memory, the final losses;
#   3. `kmp train lm --batch_size=max` in the baseline mode and the
#      smallest one, under a 16 GiB limit (a smaller GPU's memory): the
#      largest batch each fits, and the compiles it took;
#   4. on eager torch (PyTorch is there, Keras's torch backend with it):
#      one AdamW update in each mode (optimizer_update.py: kmp's grouped
#      update against its per-variable one, a kernel launch per
#      operation), then the modes trained as in 2.
#
# Run on the device machine through Keras's JAX backend (../shared/GPU.md:
# no TensorFlow there; KerasHub feeds arrays through grain there, whose
# wheels, with keras-hub's, travel in .whl), from the repository root:
#
#   OUT=DIR benchmarks/gpu_memory.sh              # GPU sizes
#   OUT=DIR SIZE=small benchmarks/gpu_memory.sh   # checks the script on a CPU
#
# Writes each step's JSON, log and wall time under $OUT.
set -u
# $OUT, $SIZE, $PYTHON, the JAX backend, `step`, gpu.csv:
source "$(dirname "$0")/gpu_common.sh"

if [ "$SIZE" = gpu ]; then  # width heads layers sequence text_bytes
  read -r WIDTH HEADS LAYERS SEQUENCE TEXT <<<"1024 16 8 512 2000000"
  FOOTPRINT=(--batch_size=32)
  MODES=(--steps=40)
  LIMIT=17179869184
  LIMITS=(120 200 220 90 200)
else
  read -r WIDTH HEADS LAYERS SEQUENCE TEXT <<<"32 2 1 32 20000"
  FOOTPRINT=(--batch_size=4)
  MODES=(--steps=2)
  LIMIT=20000000
  LIMITS=(300 300 300 300 300)
fi
LM=(--hidden_dim="$WIDTH" --heads="$HEADS" --layers="$LAYERS"
    --sequence_length="$SEQUENCE" --data=synthetic --text_bytes="$TEXT")

step footprint "${LIMITS[0]}" "$PYTHON" benchmarks/memory_footprint.py lm \
  "${FOOTPRINT[@]}" --output "$OUT/memory_footprint_lm_jax.json" -- "${LM[@]}"

step modes "${LIMITS[1]}" "$PYTHON" benchmarks/memory_modes.py lm \
  "${MODES[@]}" --modes="float32,bf16 state,both,both + remat" \
  --output "$OUT/memory_modes_lm_jax.json" -- "${LM[@]}" --batch_size=16

for mode in float32 both; do
  if [ "$mode" = both ]; then
    FLAGS=(--optimizer_states=bfloat16 --master_weights=bfloat16 --remat)
  else
    FLAGS=()
  fi
  step "max_batch_$mode" "$((LIMITS[2] / 2))" "$PYTHON" -m kmp_cli train lm \
    --policy=mixed_bfloat16 "${LM[@]}" "${FLAGS[@]}" --batch_size=max \
    --memory_limit="$LIMIT" --steps=3 --epochs=1 --verbose=0 \
    --output_dir="$OUT/max_batch_$mode"
  rm -f "$OUT/max_batch_$mode"/*.keras  # large, and nothing to read
done

step torch_update "${LIMITS[3]}" env KERAS_BACKEND=torch "$PYTHON" \
  benchmarks/optimizer_update.py --hidden_dim="$WIDTH" --layers="$LAYERS" \
  --sequence_length="$SEQUENCE" --output "$OUT/optimizer_update_torch.json"

step modes_torch "${LIMITS[4]}" env KERAS_BACKEND=torch "$PYTHON" \
  benchmarks/memory_modes.py lm "${MODES[@]}" \
  --modes="float32,bf16 state,both" \
  --output "$OUT/memory_modes_lm_torch.json" -- "${LM[@]}" --batch_size=16
