# Session 24, run 2 (H200): bias+GELU's Mosaic GPU z-form (rcp.approx.ftz) compiled: its GPU tests, its SASS, then
# the alternating A/B against session 23's kernels.
export PATH=$PWD/build/bin:$PATH
python -m pytest -q -m gpu tests/test_mgpu.py -k "bias_gelu" 2>&1 | tail -3 | tee $OUT/tests.txt
for r in 0.1 0; do
  d=$OUT/dump_p$r; mkdir -p $d
  MOSAIC_GPU_DUMP_TO=$d python benchmarks/gpu_scripts/session24/dump_kernels.py $r bg_fwd@8192x4096 \
    bg_bwd@8192x4096 2>&1 | grep -v Warning | grep -v nvdisasm | grep -v dump.cc | tail -2
  rm -f $d/*.mlir-passes.log
  for f in $d/*.ptx; do
    /usr/local/cuda/bin/ptxas -arch=sm_90a -O3 -v $f -o ${f%.ptx}.cubin 2> ${f%.ptx}.ptxas-v.txt
    nvdisasm -c ${f%.ptx}.cubin > ${f%.ptx}.sass || echo "nvdisasm failed on $f"
    rm -f ${f%.ptx}.cubin
  done
done
(cd $OUT && tar czf dumps.tgz dump_p* && rm -rf dump_p*)
python benchmarks/gpu_scripts/session24/ab_gelu_z.py --rounds 3 2>&1 | grep -v Warning | tee $OUT/ab_gelu_z.txt
