# Session 24: SASS of Mosaic GPU kernels, one directory per dropout rate, packed as $OUT/dumps.tgz.
#   bash benchmarks/gpu_scripts/session24/dump_sass.sh "0.1 0" bg_fwd@8192x4096 ln_bwd@8192x768 ...
# `dump_kernels.py` runs each kernel once under MOSAIC_GPU_DUMP_TO (PTX and ptxas log); Mosaic GPU's own SASS dump
# cannot spawn nvdisasm there, so ptxas -> cubin -> `nvdisasm -c` by hand (nvdisasm from PyPI's nvidia-cuda-nvdisasm
# wheel, carried as build/bin). Count instructions with `sass_counts.py` on the unpacked directory.
export PATH=$PWD/build/bin:$PATH
rates=$1; shift
for r in $rates; do
  d=$OUT/dump_p$r; mkdir -p $d
  MOSAIC_GPU_DUMP_TO=$d python benchmarks/gpu_scripts/session24/dump_kernels.py $r "$@" 2>&1 \
    | grep -v Warning | grep -v nvdisasm | grep -v dump.cc | tail -3
  rm -f $d/*.mlir-passes.log
  for f in $d/*.ptx; do
    /usr/local/cuda/bin/ptxas -arch=sm_90a -O3 -v $f -o ${f%.ptx}.cubin 2> ${f%.ptx}.ptxas-v.txt
    nvdisasm -c ${f%.ptx}.cubin > ${f%.ptx}.sass || echo "nvdisasm failed on $f"
    rm -f ${f%.ptx}.cubin
  done
done
(cd $OUT && tar czf dumps.tgz dump_p* && rm -rf dump_p*)
