#!/usr/bin/env bash
# One self-contained payload for the lent offline GPU machine (the `device` tool), small enough to travel with every
# call (the 64 MiB limit counts the tracked tree too): NFCorpus + TREC DL 2019/2020 + all-MiniLM-L6-v2 (weights
# rounded to fp16) as one xz tarball, and the wheels the GPU image lacks (faiss-cpu's unpacked and xz-compressed).
# Run here after `make install` and ../shared/gpu-kit/prepare.sh (which fills .gpu-data and .gpu-wheels):
#   bench/gpu/pack.sh            -> .gpu-pack/ (git-ignored through .git/info/exclude)
# On the GPU machine every call starts with `bash bench/gpu/setup.sh` (idempotent; docs/gpu.md).
set -euo pipefail
repo=$(git rev-parse --show-toplevel); cd "$repo"
py=${PY:-$repo/.venv/bin/python}
exclude=$(git rev-parse --git-path info/exclude)
grep -qxF "/.gpu-pack/" "$exclude" 2>/dev/null || echo "/.gpu-pack/" >> "$exclude"
test -d .gpu-data/assets && test -d .gpu-wheels || { echo "run ../shared/gpu-kit/prepare.sh first"; exit 2; }
assets=${MULTIPOS_ASSETS:-$repo/../shared/assets}
rm -rf .gpu-pack && mkdir -p .gpu-pack/wheels /tmp/gpu-pack-stage
rm -rf /tmp/gpu-pack-stage/* && cp -r .gpu-data/assets /tmp/gpu-pack-stage/
cp -r "$assets/data/trec-dl-2019" "$assets/data/trec-dl-2020" /tmp/gpu-pack-stage/assets/data/
XZ_OPT="-9 -T2" tar -cJf .gpu-pack/assets.tar.xz -C /tmp/gpu-pack-stage assets
cp .gpu-data/to_fp32.py .gpu-pack/
for w in .gpu-wheels/*.whl; do case "$w" in *faiss*) ;; *) cp "$w" .gpu-pack/wheels/ ;; esac; done
# what the image lacks beyond the kit's wheels, at this venv's versions: `datasets` (sentence-transformers' Trainer,
# bench/bench_fit_vs_st.py), the Optuna sweeper and SLURM launcher plugins (configs the suite composes). Not wandb
# (20 MB; imported only by logger=wandb) nor the notebook kernel (tests/test_notebooks.py is deselected there).
version() { "$py" -c "import importlib.metadata as m; print(m.version('$1'))"; }
plat="--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_5_x86_64"
pkgs=""
for p in datasets dill multiprocess hydra-optuna-sweeper optuna sqlalchemy alembic mako colorlog cmaes hydra-submitit-launcher submitit hydra-joblib-launcher; do
  pkgs="$pkgs $p==$(version $p)"
done
"$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp $plat -d .gpu-pack/wheels $pkgs
rm -rf /tmp/gpu-pack-faiss && mkdir /tmp/gpu-pack-faiss && (cd /tmp/gpu-pack-faiss && unzip -q "$repo"/.gpu-wheels/faiss_cpu-*.whl)
XZ_OPT="-9 -T2" tar -cJf .gpu-pack/faiss.tar.xz -C /tmp/gpu-pack-faiss .
rm -rf /tmp/gpu-pack-stage /tmp/gpu-pack-faiss
# every tracked file's size summed (xargs may split the list: one total of du per batch would count the last batch only)
tracked=$(git ls-files -z | xargs -0 stat -c %s 2>/dev/null | awk '{s += $1} END {print s + 0}')
pack=$(du -sb .gpu-pack | cut -f1)
echo "tracked tree $tracked + .gpu-pack $pack = $((tracked + pack)) bytes (limit $((64 * 1024 * 1024)))"
# the big CPU query-side archives (experiments/sweeps/cpu-query_side-*, text, about 38 MiB; read only by slow tests)
# are never needed on the GPU: leave them behind for the call, and `git restore experiments/sweeps` after it
[ $((tracked + pack)) -lt $((64 * 1024 * 1024)) ] || echo "over the limit: rm -r experiments/sweeps/cpu-query_side-* for the call, git restore experiments/sweeps after"
