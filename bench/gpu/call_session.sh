#!/usr/bin/env bash
# The whole GPU session in one call (docs/gpu.md, "The next GPU session"): a session has 15 minutes of device time,
# which buys one machine start and about ten minutes of commands, so the suite, the main job and the speed benches
# run back to back here (at most 585 s; run it with timeout_s 595 and carry .gpu-pack). Results: $OUT/suite.tar.gz
# (bench/gpu/call_suite.sh) and $OUT/main.tar.gz (bench/gpu/call_main.sh). bench_speed.py times the Lightning loop
# with 4, 8 and 12 DataLoader workers: on the H200 (H3, 2026-11-26) 0.65 / 0.75 / 0.84 of the bare step, when collating
# one B=64 x G=8 batch took about 0.33 s a worker; since the passage token store (12538d6) it takes about 0.03 s.
# Limits (H3/H4 on the H200, 2026-11-26: the suite 205 s with -n 8, the main job 151 s, bench_speed 71 s, fit_vs_st 42 s,
# setup about 30 s on a fresh machine): they add up to 585 s at most.
SUITE_S=${SUITE_S:-240} BENCH=0 bash bench/gpu/call_suite.sh
TRAIN_S=${TRAIN_S:-170} SPEED_S=${SPEED_S:-90} FIT_S=${FIT_S:-55} \
  SPEED_ARGS="--skip ddp share --no-full-step --workers 4,8,12 --loop-steps 30" bash bench/gpu/call_main.sh
