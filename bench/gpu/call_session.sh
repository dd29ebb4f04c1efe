#!/usr/bin/env bash
# The whole GPU session in one call (docs/gpu.md, "The next GPU session"): a session has 15 minutes of device time,
# which buys one machine start and about ten minutes of commands, so the suite, the main job and the speed benches
# run back to back here (about 560 s; run it with timeout_s 595 and carry .gpu-pack). Results: $OUT/suite.tar.gz
# (bench/gpu/call_suite.sh) and $OUT/main.tar.gz (bench/gpu/call_main.sh). bench_speed.py times the Lightning loop
# with 4, 8 and 12 DataLoader workers: on the H200 (2026-11-26) the loop ran at 0.705 of the bare step with 4, and
# collating one B=64 x G=8 batch takes about 0.33 s on one CPU core, more than 4 workers can deliver per GPU step.
SUITE_S=${SUITE_S:-190} BENCH=0 bash bench/gpu/call_suite.sh
TRAIN_S=${TRAIN_S:-200} SPEED_S=${SPEED_S:-70} FIT_S=${FIT_S:-70} \
  SPEED_ARGS="--skip ddp share --no-full-step --workers 4,8,12 --loop-steps 30" bash bench/gpu/call_main.sh
