#!/usr/bin/env bash
# On the GPU machine, from the repo root: unpack .gpu-pack (bench/gpu/pack.sh) into /tmp/keep/assets and /tmp/site once
# per machine; later calls find them. Source it: `. bench/gpu/setup.sh || exit 3` exports what the jobs need.
if [ ! -f /tmp/keep/.done ]; then
  if [ ! -d .gpu-pack ]; then echo "no .gpu-pack: carry it (bench/gpu/pack.sh)"; return 3 2>/dev/null || exit 3; fi
  mkdir -p /tmp/keep /tmp/site && tar -xJf .gpu-pack/assets.tar.xz -C /tmp/keep \
    && python3 .gpu-pack/to_fp32.py /tmp/keep/assets/models/all-MiniLM-L6-v2/model.safetensors \
    && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .gpu-pack/wheels/*.whl \
    && tar -xJf .gpu-pack/faiss.tar.xz -C /tmp/site && touch /tmp/keep/.done \
    || { echo "setup failed"; return 4 2>/dev/null || exit 4; }
fi
export PYTHONPATH=/tmp/site:$PWD/src:$PWD MULTIPOS_ASSETS=/tmp/keep/assets MULTIPOS_CACHE=/tmp/cache HF_HUB_OFFLINE=1 \
  PYTHONUNBUFFERED=1 NUMBA_CACHE_DIR=/tmp/numba CUBLAS_WORKSPACE_CONFIG=:4096:8
unset PYTHONDONTWRITEBYTECODE
