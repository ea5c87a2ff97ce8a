#!/usr/bin/env bash
# SASS of Mosaic GPU row kernels (a Hopper GPU), one directory per dropout rate, packed as OUTDIR/dumps.tgz:
#   PYTHONPATH=. bash benchmarks/tools/dump_sass.sh OUTDIR "0.1 0" bg_fwd@8192x4096 ln_bwd@8192x768 ...
# `dump_kernels.py` runs each kernel once under MOSAIC_GPU_DUMP_TO (PTX and ptxas log); Mosaic GPU's own SASS dump
# does not always find nvdisasm, so this does ptxas -> cubin -> `nvdisasm -c` itself. Needs ptxas (CUDA toolkit; $PTXAS
# overrides /usr/local/cuda/bin/ptxas) and nvdisasm on PATH (e.g. PyPI's nvidia-cuda-nvdisasm wheel). Count the
# instructions with `python benchmarks/tools/sass_counts.py` on the unpacked directories.
set -uo pipefail
if [ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ]; then
  sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//'
  exit 0
fi
if [ $# -lt 3 ]; then
  echo "usage: bash benchmarks/tools/dump_sass.sh OUTDIR RATES KERNEL@RxD... (--help for more)" >&2
  exit 2
fi
out=$1; rates=$2; shift 2
ptxas=${PTXAS:-/usr/local/cuda/bin/ptxas}
here=$(dirname "$0")
mkdir -p "$out"
for r in $rates; do
  d=$out/dump_p$r; mkdir -p "$d"
  MOSAIC_GPU_DUMP_TO=$d python "$here/dump_kernels.py" "$r" "$@" 2>&1 \
    | grep -v -e Warning -e nvdisasm -e dump.cc | tail -3
  rm -f "$d"/*.mlir-passes.log
  for f in "$d"/*.ptx; do
    "$ptxas" -arch=sm_90a -O3 -v "$f" -o "${f%.ptx}.cubin" 2> "${f%.ptx}.ptxas-v.txt"
    nvdisasm -c "${f%.ptx}.cubin" > "${f%.ptx}.sass" || echo "nvdisasm failed on $f"
    rm -f "${f%.ptx}.cubin"
  done
done
(cd "$out" && tar czf dumps.tgz dump_p* && rm -rf dump_p*)
