#!/usr/bin/env bash
# Two-GPU evidence: the DataParallel dtype claim of AMP201 and verify --nproc 2 on the migrated
# apex-DDP fixture.   OUT=bench/results/multi bash bench/gpu_run_multi.sh
set -u
OUT=${OUT:-bench/results/multi}
mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
nvidia-smi -L
for f in dataparallel_bf16 dataparallel_bf16_fixed; do
  echo "== verify --watch-dtypes fixtures/verify/$f.py"
  python -m ampfix verify --steps 30 --watch-dtypes --no-profile "fixtures/verify/$f.py" --json "$OUT/$f.json"
  python -c "import json,sys; r=json.load(open('$OUT/$f.json'))['runs']['amp']; print('$f: dtypes seen in the replicas (nn.Linear outputs):', r['dtypes_seen'])"
done
echo "== verify --nproc 2 fixtures/apex/after/ddp_syncbn_fusedadam.py"
python -m ampfix verify --nproc 2 --steps 30 --no-profile fixtures/apex/after/ddp_syncbn_fusedadam.py --json "$OUT/ddp_nproc2.json" --plot "$OUT/ddp_nproc2.png"
