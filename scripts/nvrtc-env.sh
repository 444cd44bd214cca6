#!/usr/bin/env bash
# Environment for NVRTC from the pip CUDA wheels (nvidia-cuda-nvrtc, -runtime, -crt, -cccl):
# `source scripts/nvrtc-env.sh` exports LD_LIBRARY_PATH (libnvrtc.so.13, loaded by cudarc)
# and SPECC_CUDA_INCLUDE (cuda_bf16.h and friends, passed to NVRTC as --include-path).
# Run it (not sourced) to print the two lines instead.
_specc_py="${PYTHON:-python3}"
_specc_sp="$("$_specc_py" -c 'import site; print(site.getsitepackages()[0])' 2>/dev/null)"
_specc_cu="${_specc_sp}/nvidia/cu13"
if [ -z "$_specc_sp" ] || [ ! -e "${_specc_cu}/lib/libnvrtc.so.13" ]; then
  echo "nvrtc-env: no pip NVRTC under '${_specc_cu}' (pip install nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cuda-crt nvidia-cuda-cccl)" >&2
else
  export LD_LIBRARY_PATH="${_specc_cu}/lib${LD_LIBRARY_PATH:+:${LD_LIBRARY_PATH}}"
  export SPECC_CUDA_INCLUDE="${_specc_cu}/include"
  if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    echo "export LD_LIBRARY_PATH=${LD_LIBRARY_PATH}"
    echo "export SPECC_CUDA_INCLUDE=${SPECC_CUDA_INCLUDE}"
  fi
fi
unset _specc_py _specc_sp _specc_cu
