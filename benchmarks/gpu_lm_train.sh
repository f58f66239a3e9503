#!/usr/bin/env bash
# Issue 41, item 4, through the example itself: `kmp train lm` with
# `--batch_size=max` on one lent GPU, its MFU in its own results.json.
# `benchmarks/lm_speed.py` measured the model's steps (45.7 % MFU at
# width 1024, batch 64, on the 2026-11-29 H200); this runs what a user
# runs: the example's feed, `fit`, its callbacks and the batch
# `kmp.app.batch_search` picks from XLA's memory analysis.
#
#   1. width 1024, 16 layers, dropout 0 (cuDNN's flash attention),
#      mixed_bfloat16, --batch_size=max;
#   2. the same at width 2048, 24 layers (16 heads of 128).
#
# The example feeds its batches through grain where TensorFlow is
# missing (the device machine), so its wheels travel in .whl with
# Keras's (BUILD_NOTES, "Measuring on a lent GPU"); without them
# `kmp train lm` stops at once with "pip install grain" (2026-11-29).
#
#   OUT=DIR benchmarks/gpu_lm_train.sh              # GPU sizes
#   OUT=DIR SIZE=small benchmarks/gpu_lm_train.sh   # checks the script on a CPU
#
# Not yet run on a GPU. An estimate from lm_speed.py's compiles on the
# H200 (about 25 s for a 1024 x 16 step, more at 2048 x 24): 100 s for
# the first run, the search's 4 or so compiles and the step's, and up to
# 280 s for the second; each step is bounded by its limit below.
set -u
source "$(dirname "$0")/gpu_common.sh"
if [ "$SIZE" = gpu ]; then
  # 10 steps an epoch: the search's batch at width 1024 may be hundreds
  # of sequences; validation is one batch.
  RUN=(--data=synthetic --dropout=0 --policy=mixed_bfloat16
    --batch_size=max --epochs=2 --steps=10 --eval_steps=1 --verbose=2)
  NARROW=(--hidden_dim=1024 --layers=16 --heads=8)
  WIDE=(--hidden_dim=2048 --layers=24 --heads=16)
  LIMITS=(200 280)
else
  RUN=(--data=synthetic --dropout=0 --policy=mixed_bfloat16
    --batch_size=max --memory_limit=256M --epochs=2 --steps=2
    --eval_steps=1 --text_bytes=100000 --sequence_length=64 --verbose=2)
  NARROW=(--hidden_dim=64 --layers=2 --heads=4)
  WIDE=(--hidden_dim=128 --layers=2 --heads=4)
  LIMITS=(300 300)
fi

step train_lm_1024 "${LIMITS[0]}" "$PYTHON" -m kmp_cli train lm \
  "${RUN[@]}" "${NARROW[@]}" --output_dir="$OUT/train_lm_1024"
step train_lm_2048 "${LIMITS[1]}" "$PYTHON" -m kmp_cli train lm \
  "${RUN[@]}" "${WIDE[@]}" --output_dir="$OUT/train_lm_2048"
# The models and plots: large, or nothing to read (a call returns at
# most 8 files). A run that ends deletes its backup; one that timed out
# leaves it.
rm -rf "$OUT"/train_lm_*/*.keras "$OUT"/train_lm_*/results.png \
  "$OUT"/train_lm_*/backup
