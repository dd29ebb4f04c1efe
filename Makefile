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

.PHONY: install train study studies-query-side render lint test test-slow bench clean-cache

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
## NFCorpus, three seeds into multirun/default-cpu (a re-run skips finished seeds), then the summary (test nDCG@10
## mean ± sd, paired t-tests vs the zero-shot start and BM25). It first prints its plan and expected wall time, then
## prepares the first seed on every core (prepare_only=true: corpora encoded, training data and reference rows
## cached), then trains the seeds side by side, one core's share each (parallel_jobs = the number of seeds, 3 by
## default; PARALLEL= one after another).
## One seed: make train SEEDS=42. Two-tower: make train EXPERIMENT=two_tower PARALLEL= (docs/two-tower.md).
## Your own data: make train DATA=<BEIR folder | Tevatron .jsonl> [BUDGET=<minutes of recipe search>] (docs/own-data.md).
EXPERIMENT ?= default
SEEDS ?= 42,43,44
BUDGET ?= 20
comma := ,
SEED_LIST := $(subst $(comma), ,$(SEEDS))
PARALLEL ?= parallel_jobs=$(words $(SEED_LIST))
train: install
ifdef DATA
	$(BIN)/python -m multipos.own_data run '$(DATA)' --budget-min $(BUDGET) --seeds $(SEEDS) $(ARGS)
else
	$(if $(filter default,$(EXPERIMENT)),$(BIN)/python -m multipos.runs.plan --seeds $(SEEDS) \
	  --parallel-jobs $(or $(patsubst parallel_jobs=%,%,$(filter parallel_jobs=%,$(PARALLEL))),1))
	$(BIN)/python train.py -m experiment=$(EXPERIMENT) seed=$(firstword $(SEED_LIST)) prepare_only=true $(ARGS)
	$(BIN)/python train.py -m experiment=$(EXPERIMENT) seed=$(SEEDS) $(PARALLEL) $(ARGS)
	$(BIN)/python -m multipos.report.summary multirun/$(EXPERIMENT)-cpu
endif

## One study of the paper: make study NAME=table2_homogeneous [ARGS="scale=paper seed=42,43,44"], then make render NAME=...
## An evaluation-only study (job: evaluate: table3_ood, the WiSE-FT curves) runs through evaluate.py (ARGS="scale=paper").
JOB_OF = $(if $(shell grep -qx 'job: evaluate' conf/experiment/$(1).yaml && echo y),evaluate.py,train.py)
study: install
	$(BIN)/python $(call JOB_OF,$(NAME)) -m experiment=$(NAME) $(ARGS)

## Every query-side study with five seeds (seeds 42-46, two runs side by side), each rendered after its sweep, in the
## order that lets a study copy the runs it shares with one before it (reuse_equivalent, docs/reliability.md): Table 3
## evaluates Table 2's models, the figure copies Table 2's G=8, M=4 cells and Appendix B's first-M cells at G=16, and
## the candidate set the figure's group cells. Hours on 2 cores (docs/experiments.md gives each study's wall time).
QUERY_SIDE_STUDIES = table2_homogeneous table3_ood table4_heterogeneous table5_curriculum table6_lsepair_variants \
	table7_budget table8_first_vs_random_m table9_recontriever figure_ratio_ablation
studies-query-side: install
	set -e; for s in $(QUERY_SIDE_STUDIES); do \
	  if grep -qx 'job: evaluate' conf/experiment/$$s.yaml; then job=evaluate.py; else job=train.py; fi; \
	  $(BIN)/python $$job -m experiment=$$s scale=cpu_query_side seed=42,43,44,45,46 parallel_jobs=2 $(ARGS); \
	  $(BIN)/python -m multipos.report.render multirun/$$s-cpu-query_side; done
	$(BIN)/python train.py -m experiment=candidate_set parallel_jobs=2 $(ARGS)
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
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -n auto --maxprocesses $(TEST_WORKERS_MAX) $(ARGS)

## Linter (ruff, settings in pyproject.toml); make test runs it first.
lint: install
	$(BIN)/ruff check .

## Long end-to-end runs.
test-slow: install
	$(BIN)/python -m pytest -m slow $(ARGS)

## Benchmarks, appended to bench/results/{speed,search}.jsonl: multipos vs a bare PyTorch step, sentence-transformers
## MNRL and encode, the Lightning loop, objective share, DDP/GradCache (bench_speed.py); FAISS index kinds and
## sharded search (bench_search.py); query-side vs two-tower step per training query (bench_query_side.py); what the
## main process pays per batch from a DataLoader worker, groups and staging copy (bench_batch_receive.py); one-thread
## runs side by side vs one run on every core, a study's step and make train's (bench_parallel_runs.py, CPU only:
## parallel_jobs=2).
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
