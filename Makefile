# multipos — two set-up commands: `make train` (main job) and `make test` (test suite).
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed

# The shell here sets PYTHONDONTWRITEBYTECODE, which doubles start-up time of every process.
unexport PYTHONDONTWRITEBYTECODE
export NUMBA_CACHE_DIR ?= $(CURDIR)/.cache/numba
export HF_HUB_DISABLE_TELEMETRY := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: install train study studies-query-side render test test-slow bench clean-cache

## --no-compile: pip would byte-compile every module of the stack (92 s for the whole install here, 48 s without);
## Python compiles, and caches, only the modules a run imports, the first time it imports them (about 10 s once).
## ranx (pyproject's pin) goes first, then its numba functions compile into NUMBA_CACHE_DIR on the core pip leaves
## idle while it installs the rest (python -m multipos.evaluation.metrics: about 30 s; otherwise the first
## evaluation of every new checkout pays them). Its failure costs only that time, never the install.
RANX_PIN = $(shell sed -n 's/^ *"\(ranx[^"]*\)".*/\1/p' pyproject.toml)
install: $(STAMP)
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --no-compile '$(RANX_PIN)'
	PYTHONPATH=src $(BIN)/python -m multipos.evaluation.metrics > $(VENV)/compile-metrics.log 2>&1 & \
	  $(BIN)/python -m pip install -q --no-compile -e '.[test]' && { wait $$! || echo "ranx precompile failed: $(VENV)/compile-metrics.log"; }
	touch $(STAMP)

## The main job on the embedded default (conf/experiment/default.yaml): query-side fine-tuning of all-MiniLM-L6-v2 on
## NFCorpus (JointLH, every corpus passage a candidate), three seeds into multirun/default-cpu (a re-run skips finished
## seeds), then the summary: test nDCG@10 mean ± sd, p-value vs the zero-shot start, BM25, TREC DL 2019/2020.
## Two-tower: make train EXPERIMENT=two_tower PARALLEL= (seeds one after another: two-tower runs side by side ran out of
## memory on 24 GiB, docs/two-tower.md). One seed: make train SEEDS=42.
## First the first seed's run is prepared on every core (prepare_only=true: corpora encoded, training data, reference
## rows, all into the caches); then every seed trains side by side, the cores shared between them (launcher=parallel,
## one run per seed; on 2 cores one torch thread each: three one-thread runs make 1.3x the main job's steps a second of
## one run on both cores in bf16, 1.14x in fp32: bench/bench_parallel_runs.py --step main --side-by-side 2,3 [--bf16],
## 2026-11-26). PARALLEL= trains them one after another.
EXPERIMENT ?= default
SEEDS ?= 42,43,44
comma := ,
SEED_LIST := $(subst $(comma), ,$(SEEDS))
PARALLEL ?= launcher=parallel parallel_jobs=$(words $(SEED_LIST))
train: install
	$(BIN)/python train.py -m experiment=$(EXPERIMENT) seed=$(firstword $(SEED_LIST)) prepare_only=true $(ARGS)
	$(BIN)/python train.py -m experiment=$(EXPERIMENT) seed=$(SEEDS) $(PARALLEL) $(ARGS)
	$(BIN)/python -m multipos.report.summary multirun/$(EXPERIMENT)-cpu

## One study of the paper: make study NAME=table2_homogeneous [ARGS="scale=paper seed=42,43,44"], then make render NAME=...
study: install
	$(BIN)/python train.py -m experiment=$(NAME) $(ARGS)

## Every query-side study with five seeds (seeds 42-46, two runs side by side), each rendered after its sweep, in the
## order that lets a study copy the runs it shares with one before it (reuse_equivalent, docs/reliability.md): Table 3
## evaluates Table 2's models, the figure copies Table 2's G=8, M=4 cells and Appendix B's first-M cells at G=16, and
## the candidate set the figure's group cells. Hours on 2 cores (docs/experiments.md gives each study's wall time).
QUERY_SIDE_STUDIES = table2_homogeneous table3_ood table4_heterogeneous table5_curriculum table6_lsepair_variants \
	table7_budget table8_first_vs_random_m table9_recontriever figure_ratio_ablation
studies-query-side: install
	set -e; for s in $(QUERY_SIDE_STUDIES); do \
	  $(BIN)/python train.py -m experiment=$$s fine_tuning=query_side seed=42,43,44,45,46 launcher=parallel $(ARGS); \
	  $(BIN)/python -m multipos.report.render multirun/$$s-cpu-query_side; done
	$(BIN)/python train.py -m experiment=candidate_set launcher=parallel $(ARGS)
	$(BIN)/python -m multipos.report.render multirun/candidate_set-cpu-query_side

render: install
	$(BIN)/python -m multipos.report.render multirun/$(NAME)-$(or $(SCALE),cpu)

## Default test suite (unit tests + a short real-data smoke test), < 10 minutes on 2 cores.
## pytest-xdist runs it in one worker per core, at most TEST_WORKERS_MAX (each worker takes torch + a model: about 1-2 GB),
## and tests/conftest.py gives each worker its share of the cores. On a 2-core AMD EPYC without native bf16
## (2026-11-27, clean clone, code a3d32bd): pytest 8.3 min with 2 workers; 18.1 min in one process at 1469d8c.
## One process: make test ARGS="-n 0".
TEST_WORKERS_MAX ?= 4
test: install
	$(BIN)/python -m pytest -n auto --maxprocesses $(TEST_WORKERS_MAX) $(ARGS)

## Long end-to-end runs.
test-slow: install
	$(BIN)/python -m pytest -m slow $(ARGS)

## Benchmarks, appended to bench/results/{speed,search}.jsonl: multipos vs a bare PyTorch step, sentence-transformers
## MNRL and encode, the Lightning loop, objective share, DDP/GradCache (bench_speed.py); FAISS index kinds and
## sharded search (bench_search.py); query-side vs two-tower step per training query (bench_query_side.py); what the
## main process pays per batch from a DataLoader worker, groups and staging copy (bench_batch_receive.py); one-thread
## runs side by side vs one run on every core, a study's step and make train's (bench_parallel_runs.py, CPU only:
## launcher=parallel).
## Quick sizes on a CPU, full sizes on CUDA. make bench ARGS="--threads 1"
bench: install
	$(BIN)/python bench/bench_speed.py $(ARGS)
	$(BIN)/python bench/bench_search.py
	$(BIN)/python bench/bench_query_side.py
	$(BIN)/python bench/bench_loop_logging.py
	$(BIN)/python bench/bench_batch_receive.py
	$(BIN)/python bench/bench_parallel_runs.py
	$(BIN)/python bench/bench_parallel_runs.py --step main --side-by-side 2,3 --bf16

clean-cache:
	rm -rf .cache/embeddings
