# Sourced at the start of a GPU-machine run: the wheels the machine lacks and this package's own wheel (built here
# with `pip wheel --no-deps . -w .whl` just before the call; all carried in .whl/),
# installed into /tmp/site (first on PYTHONPATH). NVLink multicast stays off (the machine's rule).
set -e
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
set +e
