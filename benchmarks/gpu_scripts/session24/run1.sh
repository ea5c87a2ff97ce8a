# Session 24, run 1: the SASS of bias+GELU's Mosaic GPU forward/backward (8192x4096, with and without dropout) and of
# BDRLN's forward (8192x768 with dropout), to count instructions per element. nvdisasm travels in build/bin (the
# nvidia-cuda-nvdisasm 13.5 wheel); Mosaic GPU's own SASS dump could not spawn it, so ptxas + nvdisasm by hand.
export PATH=$PWD/build/bin:$PATH
for r in 0.1 0; do
  d=$OUT/dump_p$r; mkdir -p $d
  MOSAIC_GPU_DUMP_TO=$d python benchmarks/gpu_scripts/session24/dump_kernels.py $r bg_fwd@8192x4096 \
    bg_bwd@8192x4096 ln_fwd@8192x768 2>&1 | grep -v Warning | grep -v nvdisasm | tail -3
  rm -f $d/*.mlir-passes.log
  for f in $d/*.ptx; do
    /usr/local/cuda/bin/ptxas -arch=sm_90a -O3 -v $f -o ${f%.ptx}.cubin 2> ${f%.ptx}.ptxas-v.txt
    nvdisasm -c ${f%.ptx}.cubin > ${f%.ptx}.sass || echo "nvdisasm failed on $f"
    rm -f ${f%.ptx}.cubin
  done
done
cd $OUT && tar czf dumps.tgz dump_p* && rm -rf dump_p* && ls -la
