#!/usr/bin/env bash
# A GPU session's commands in one call (docs/gpu.md, "The next GPU session"): a session has 15 minutes of device time,
# which buys one machine start and about ten minutes of commands. Results: $OUT/suite.tar.gz (bench/gpu/call_suite.sh)
# and $OUT/main.tar.gz (bench/gpu/call_main.sh); run it with carry .gpu-pack and a timeout_s above the sum below.
# Times on the H200 (H3 and H5, 2026-11-26): setup about 30 s on a fresh machine, the suite 205-235 s with -n 8, the
# main job 151 s, bench_speed.py 60-70 s with one Lightning loop per worker count, bench_fit_vs_st.py 40 s.
# SUITE_S=0 / TRAIN_S=0 skip the suite / the main job (H5 ran both: the suite passed whole on H5b, the main job gave
# H3's numbers again), which leaves the benches: `SUITE_S=0 TRAIN_S=0 bash bench/gpu/call_session.sh`, about 230 s.
# bench_speed.py times the Lightning loop in 3 rounds, each against a bare loop timed right before it (H5's bare loop
# moved 36 % between two runs; each round also times the loop over collated batches, with and without its per-step
# logging, and both loops synchronised only at their ends): about 135 s expected. The 8 and 12 worker loops of H3/H5
# are left out for that time (H5: 0.88 and 1.005). Stopped at SPEED_S it still writes its line with the rounds it
# finished (`stopped_in`). Suite, benches and setup: at most about 490 s.
# All three parts (up to 625 s) no longer fit one call: give the suite a call of its own when it must run.
# The benches come first (since 2026-11-26, after H5), on a machine nothing else has loaded yet: H1's benches started
# right after the suite at a 1-minute load of 15.5, and the suite is the part that can be cut (SUITE_S) without loss.
# Since H6 (2026-11-27) bench_speed.py skips the encode phase (encode_vs_st met at H3 and H5; H6's cut came in it) and
# times, in each round, the loop over the data module's own batches collated beforehand, the loop over the data module,
# and the same with its workers sending by file descriptor. FIT_S=0 leaves out bench_fit_vs_st.py (met at H5 and H6).
# SPEED_ARGS (environment) replaces bench_speed.py's options, e.g. the encode phase alone: SUITE_S=0 TRAIN_S=0 FIT_S=0
# RECEIVE_S=0 SPEED_S=90 SPEED_ARGS="--skip ddp share steps collate" bash bench/gpu/call_session.sh
TRAIN_S=${TRAIN_S:-170} SPEED_S=${SPEED_S:-150} FIT_S=${FIT_S:-55} \
  SPEED_ARGS="${SPEED_ARGS:---skip ddp share encode --no-full-step --loop-steps 30 --loop-rounds 3}" bash bench/gpu/call_main.sh
[ "${SUITE_S:-240}" = 0 ] || SUITE_S=${SUITE_S:-240} BENCH=0 bash bench/gpu/call_suite.sh
