# Session 24, run 13 (H100; sm_90a SASS as on the H200): the SASS of BDRLN's Mosaic GPU backward at 8192x768 and
# 8192x1024, with and without dropout, to count its instructions per element as run 1 did for bias+GELU.
export PATH=$PWD/build/bin:$PATH
for r in 0.1 0; do
  d=$OUT/dump_p$r; mkdir -p $d
  MOSAIC_GPU_DUMP_TO=$d python benchmarks/gpu_scripts/session24/dump_kernels.py $r ln_bwd@8192x768 ln_bwd@8192x1024 \
    2>&1 | grep -v Warning | grep -v nvdisasm | grep -v dump.cc | tail -2
  rm -f $d/*.mlir-passes.log
  for f in $d/*.ptx; do
    /usr/local/cuda/bin/ptxas -arch=sm_90a -O3 -v $f -o ${f%.ptx}.cubin 2> ${f%.ptx}.ptxas-v.txt
    nvdisasm -c ${f%.ptx}.cubin > ${f%.ptx}.sass || echo "nvdisasm failed on $f"
    rm -f ${f%.ptx}.cubin
  done
done
(cd $OUT && tar czf dumps.tgz dump_p* && rm -rf dump_p*)
