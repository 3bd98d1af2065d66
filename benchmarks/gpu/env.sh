# The GPU machine's environment for the scripts beside this one (sourced from the repository root):
# that machine's default CXX builds an extension that crashes on every error message, so the
# system g++ builds it, once, into one cache that every stage shares; the CUDA kernels are built
# for Hopper (H100/H200) unless TORCH_CUDA_ARCH_LIST says otherwise; nothing is fetched.
export CXX=/usr/bin/g++ CC=/usr/bin/gcc PYTHONPATH=$PWD PYTHONUNBUFFERED=1 MAX_JOBS=16 \
  TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0} TORCH_EXTENSIONS_DIR=/tmp/attnmetrics-ext \
  ATTNMETRICS_CUDA=1 ATTNMETRICS_OFFLINE=1 HF_HUB_OFFLINE=1
