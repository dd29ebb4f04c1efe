#!/usr/bin/env bash
# GPU call 1 (docs/gpu.md): the whole default suite, tests/test_cuda.py included, with its tiny training jobs on CUDA, and the
# paper-scale bench (bert-base two-tower step; query-side over an 8.8M x 768 bf16 index). Results -> $OUT/suite.tar.gz.
. bench/gpu/setup.sh || exit 3
R=/tmp/results/suite; mkdir -p $R
{ nvidia-smi; nproc; free -g; python3 -c "import torch, transformers, sentence_transformers, lightning, peft, faiss, datasets
print('torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__, 'st', sentence_transformers.__version__,
      'lightning', lightning.__version__, 'peft', peft.__version__, 'faiss', faiss.__version__, 'datasets', datasets.__version__)"; } > $R/env.txt 2>&1
t0=$(date +%s)
MULTIPOS_TEST_ACCELERATOR=gpu timeout ${SUITE_S:-290} python3 -m pytest -p no:cacheprovider -q -n 8 --timeout 240 \
  -rA --deselect tests/test_notebooks.py --junitxml=$R/suite.xml > $R/suite.log 2>&1; echo "suite rc=$? $(( $(date +%s) - t0 )) s" | tee -a $R/times.txt
if [ "${BENCH:-1}" = 1 ]; then
  t0=$(date +%s)
  timeout 150 python3 bench/bench_paper_scale.py --out $R/speed.jsonl > $R/paper_scale.log 2>&1; echo "paper_scale rc=$? $(( $(date +%s) - t0 )) s" | tee -a $R/times.txt
fi
tar -czf $OUT/suite.tar.gz -C /tmp/results suite
echo "test_cuda.py passed: $(grep -c "^PASSED tests/test_cuda.py" $R/suite.log)"; grep -E "^(FAILED|ERROR)" $R/suite.log | head -30; tail -n 2 $R/suite.log; tail -c 1500 $R/speed.jsonl
