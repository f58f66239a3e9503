#!/usr/bin/env bash
# Issue 41, item 4, through the example itself: `kmp train lm` with
# `--batch_size=max` on one lent GPU, its MFU in its own results.json.
# `benchmarks/lm_speed.py` measured the model's steps (45.7 % MFU at
# width 1024, batch 64, on the 2026-11-29 H200); this runs what a user
# runs: the example's feed, `fit`, its callbacks and the batch
# `kmp.app.batch_search` picks from XLA's memory analysis.
#
#   1. width 1024, 16 layers, dropout 0 (cuDNN's flash attention),
#      mixed_bfloat16, --batch_size=max under a 32 GiB limit (the batch
#      past 64 buys little: 45.7 % MFU at 64, 46.4 % at 128);
#   2. width 2048, 24 layers (16 heads of 128) at lm_speed.py's batch of
#      16 (47.9 % MFU there): the example's own rate at the same shape.
#
# The example feeds its batches through grain where TensorFlow is
# missing (the device machine), so its wheels travel in .whl with
# Keras's (BUILD_NOTES, "Measuring on a lent GPU"); without them
# `kmp train lm` stops at once with "pip install grain" (2026-11-29).
#
#   OUT=DIR benchmarks/gpu_lm_train.sh              # GPU sizes
#   OUT=DIR SIZE=small benchmarks/gpu_lm_train.sh   # checks the script on a CPU
#
# Not yet run on a GPU. The time is the compiles': each probe of the
# search compiled in 19-34 s on the 2026-11-26 H200 at width 1024 and 8
# layers (BENCHMARKS.md, "Memory modes on an H200"), and the search takes
# about 4, then the step's own; so up to 420 s for the first run and 150
# s for the second, each bounded by its limit below.
set -u
source "$(dirname "$0")/gpu_common.sh"
if [ "$SIZE" = gpu ]; then
  # 10 steps an epoch, validation one batch: the compiles are the time.
  RUN=(--data=synthetic --dropout=0 --policy=mixed_bfloat16 --epochs=2
    --steps=10 --eval_steps=1 --verbose=2)
  NARROW=(--hidden_dim=1024 --layers=16 --heads=8 --batch_size=max
    --memory_limit=32G)
  WIDE=(--hidden_dim=2048 --layers=24 --heads=16 --batch_size=16)
  LIMITS=(420 150)
else
  RUN=(--data=synthetic --dropout=0 --policy=mixed_bfloat16 --epochs=2
    --steps=2 --eval_steps=1 --text_bytes=100000 --sequence_length=64
    --verbose=2)
  NARROW=(--hidden_dim=64 --layers=2 --heads=4 --batch_size=max
    --memory_limit=256M)
  WIDE=(--hidden_dim=128 --layers=2 --heads=4 --batch_size=16)
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
