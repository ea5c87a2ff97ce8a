# Session 29, run 8 (H200): the embedding forward with several tiles per program and the next tile's word rows
# fetched ahead (`Blocks.tiles_per_program`): every forward candidate by device time, each checked against the
# reference first (`benchmarks/kernels.py --tune`).
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=.
python benchmarks/kernels.py --ops embedding --passes fwd --device-time 20 --tune 2>&1 | grep -v Warning | tee $OUT/tune.txt
