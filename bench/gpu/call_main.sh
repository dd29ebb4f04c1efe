#!/usr/bin/env bash
# GPU call 2 (docs/gpu.md): the main job (`make train`'s command with trainer=gpu, three seeds, into
# multirun/default-cpu-gpu), its summary, then the speed benches on the same GPU: bench_speed.py (multipos vs bare
# step vs sentence-transformers MNRL, Lightning loop vs bare step, encode vs sentence-transformers, objective share)
# and bench_fit_vs_st.py (whole fit vs SentenceTransformerTrainer.train). Results -> $OUT/main.tar.gz.
# Then bench_batch_receive.py (since 2026-11-27: receiving a batch from 4 DataLoader workers with and without its
# groups, pinning it with PyTorch's copy and with multipos.model.transfer.pinned; about 30 s expected, not measured).
# Time limits: TRAIN_S (0 skips the main job), SPEED_S (0 skips bench_speed.py), RECEIVE_S (0 skips
# bench_batch_receive.py), FIT_S (0 skips bench_fit_vs_st.py) (seconds); SPEED_ARGS replaces bench_speed.py's options
# (default --skip ddp). Each 0 is tested before `timeout`, for which 0 means no limit at all (H8, 2026-11-27:
# SPEED_S=0 ran bench_speed.py to its end, 78 s of GPU time).
# bench_speed.py gets SIGTERM at SPEED_S (it then writes what it measured) and SIGKILL 15 s later.
. bench/gpu/setup.sh || exit 3
R=/tmp/results/main; mkdir -p $R
if [ "${TRAIN_S:-300}" != 0 ]; then  # TRAIN_S=0: the benches alone
  t0=$(date +%s)
  timeout ${TRAIN_S:-300} python3 train.py -m experiment=default seed=42,43,44 trainer=gpu ++scale.suffix=-gpu \
    trainer.enable_progress_bar=false > $R/train.log 2>&1; echo "main job rc=$? $(( $(date +%s) - t0 )) s" | tee -a $R/times.txt
  python3 -m multipos.report.summary multirun/default-cpu-gpu > $R/summary.txt 2>&1
fi
if [ "${SPEED_S:-150}" != 0 ]; then
  t0=$(date +%s)
  timeout -k 15 ${SPEED_S:-150} python3 bench/bench_speed.py ${SPEED_ARGS:---skip ddp} --out $R/speed.jsonl > $R/bench_speed.log 2>&1; echo "bench_speed rc=$? $(( $(date +%s) - t0 )) s" | tee -a $R/times.txt
fi
if [ "${RECEIVE_S:-60}" != 0 ]; then
  t0=$(date +%s)
  timeout ${RECEIVE_S:-60} python3 bench/bench_batch_receive.py --workers 4 --out $R/speed.jsonl > $R/batch_receive.log 2>&1; echo "batch_receive rc=$? $(( $(date +%s) - t0 )) s" | tee -a $R/times.txt
fi
if [ "${FIT_S:-140}" != 0 ]; then
  t0=$(date +%s)
  timeout ${FIT_S:-140} python3 bench/bench_fit_vs_st.py --out $R/speed.jsonl > $R/fit_vs_st.log 2>&1; echo "fit_vs_st rc=$? $(( $(date +%s) - t0 )) s" | tee -a $R/times.txt
fi
sweep=$([ -d multirun/default-cpu-gpu ] && echo multirun/default-cpu-gpu)
tar -czf $OUT/main.tar.gz --exclude='checkpoints' --exclude='model' --exclude='run.*.trec' -C /tmp/results main ${sweep:+-C $PWD $sweep}
[ -f $R/summary.txt ] && tail -n 25 $R/summary.txt; cat $R/times.txt; tail -c 2500 $R/speed.jsonl
