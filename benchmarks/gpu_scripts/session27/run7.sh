# Session 27, run 7 (H200): the BERT-large encoder layer fwd+bwd by device time (run 2's timed chains had S = 512 at
# 1.57x, session 20's 1.62x; timed chains move 10-20% between processes), then the timed chains once more.
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=.
python benchmarks/kernels.py --ops layer --passes fwd+bwd --device-time 10 2>&1 | grep -v Warning | tee $OUT/layer_device.txt
python benchmarks/kernels.py --ops layer --passes fwd+bwd --repeats 3 2>&1 | grep -v Warning | tee $OUT/layer_chain.txt
