#!/usr/bin/env bash
# GPU call 3 (docs/gpu.md): two-tower CPU-scale studies with seeds 42-44 on the GPU, same sizes as the CPU runs, into
# multirun/<study>-cpu-gpu (render: python -m multipos.report.render multirun/<study>-cpu-gpu). One process per seed,
# two studies at a time (six processes: MiniLM leaves the H100 mostly idle); everything stops at the deadline
# (STUDY_S seconds, default 470). A study re-run skips its finished runs, so a later call continues where this stopped.
# FINE_TUNING=query_side: the query-side five-seed variant (seeds 42-46, scale=cpu_query_side) into
# multirun/<study>-cpu-query_side-gpu, rendered to <study>_query_side-gpu.md; name the studies with STUDIES="..." (every
# query-side five-seed study, the candidate set and the figure included, has run on the CPU: 2026-11-25).
. bench/gpu/setup.sh || exit 3
if [ "${FINE_TUNING:-}" = query_side ]; then
  SEEDS="42 43 44 45 46"; VARIANT="scale=cpu_query_side ++scale.suffix=-query_side-gpu"; SWEEP=-cpu-query_side-gpu
  [ -n "${STUDIES:-}" ] || { echo "FINE_TUNING=query_side: name the studies, STUDIES=\"<study> ...\""; exit 2; }
else
  SEEDS="42 43 44"; VARIANT="++scale.suffix=-gpu"; SWEEP=-cpu-gpu
fi
R=/tmp/results/studies; mkdir -p $R
# the study runs earlier GPU sessions finished (experiments/sweeps/gpu-h100/, docs/gpu.md): skipped, not repeated
[ -d experiments/sweeps/gpu-h100 ] && mkdir -p multirun && \
  cp -rn experiments/sweeps/gpu-h100/*-gpu multirun/
end=$(( $(date +%s) + ${STUDY_S:-470} ))
# two-tower default: what no GPU session has finished first (Table 7's m4_f25, Tables 8 and 9, the figure), then the
# studies the archive holds (their finished runs are skipped). table3_ood (named in STUDIES) trains Table 2 again first,
# for its models, which the archive lacks: about 6 minutes for three seeds on the H200 (expected, not measured)
set -- ${STUDIES:-table7_budget table8_first_vs_random_m table9_recontriever figure_ratio_ablation table2_homogeneous table4_heterogeneous table5_curriculum table6_lsepair_variants}
study_seeds() {  # study seed...: one background process per seed, stopped at the deadline (the caller waits)
  local study=$1; shift
  [ $(( end - $(date +%s) )) -gt 30 ] || return 0  # `timeout 0` would mean no limit
  local job=train.py args="trainer=gpu $VARIANT trainer.enable_progress_bar=false"
  if grep -qx 'job: evaluate' conf/experiment/$study.yaml; then  # evaluation-only (Table 3): evaluate.py, no trainer
    job=evaluate.py; args="${VARIANT#scale=cpu_query_side }"
  fi
  for seed in "$@"; do
    timeout $(( end - $(date +%s) )) python3 $job -m experiment=$study seed=$seed $args > $R/$study-$seed.log 2>&1 &
  done
}
while [ $# -gt 0 ] && [ $(date +%s) -lt $(( end - 60 )) ]; do
  t0=$(date +%s)
  if [ "$1" = table3_ood ]; then
    # Table 3 evaluates Table 2's models (evaluate.py, init_from), which no archive keeps: Table 2 trains again here,
    # its models stay on this machine, Table 3 evaluates them, and the archive's Table 2 folder (if any) is put back unchanged
    shift; t2=multirun/table2_homogeneous$SWEEP; held=/tmp/held-table2$SWEEP
    rm -rf $held; [ -d $t2 ] && mv $t2 $held
    study_seeds table2_homogeneous $SEEDS; wait; study_seeds table3_ood $SEEDS; wait
    rm -rf $t2; [ -d $held ] && mv $held $t2
    echo "table2_homogeneous (again, for its models) + table3_ood $(( $(date +%s) - t0 )) s" | tee -a $R/times.txt
    continue
  fi
  pair="$1 ${2:-}"; shift; [ $# -gt 0 ] && shift
  for study in $pair; do study_seeds $study $SEEDS; done
  wait; echo "$pair $(( $(date +%s) - t0 )) s" | tee -a $R/times.txt
done
tar -czf $OUT/studies.tar.gz --exclude='checkpoints' --exclude='model' --exclude='run.*.trec' -C /tmp/results studies \
  -C $PWD $(ls -d multirun/*-gpu | grep -v default-cpu-gpu)
cat $R/times.txt
for f in multirun/*-gpu/*/run_info.json; do python3 -c "import json; d=json.load(open('$f')); print('$f', d['status'], round(d.get('wall_s', 0)))"; done
