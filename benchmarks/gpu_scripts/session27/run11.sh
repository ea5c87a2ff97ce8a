# Session 27, run 11 (H200): programmatic dependent launch for the Mosaic GPU row kernels (JAXFORMER_MGPU_PDL=1: each
# starts with griddepcontrol.wait, so its CTAs may launch while the kernel before it drains). The per-operator device
# time cannot show it (a kernel's own duration only grows); the train step can. Predicted: <= ~1 us per Mosaic GPU
# row kernel, 4 per layer (BDRLN x2 fwd, bias+GELU fwd ... 6 with the backward's), ~0.1-0.5% of the step.
# The compiled row-kernel tests with it on, then the BERT-large S = 128 step alternating off / on, two rounds.
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=.
JAXFORMER_MGPU_PDL=1 python -m pytest -q -m gpu tests/test_mgpu.py -k "on_gpu" 2>&1 | tail -2 | tee $OUT/tests.txt
for pdl in 0 1 1 0; do
  JAXFORMER_MGPU_PDL=$pdl python benchmarks/train_step.py --config large --kernels pallas --seq-len 128 --batch-size 64 \
    --steps 10 --repeats 3 --warmup 2 2>&1 | grep -v Warning | tail -1 | sed "s/^/pdl=$pdl /" | tee -a $OUT/step.txt
done
