# Session 27, run 9 (H100): the compiled Mosaic GPU tests on the H100 (c2af492's statistics fix included), then the
# README's four H100 train-step rows on main's head (session 24's were a300ef9's).
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=.
python -m pytest -q -m gpu tests/test_mgpu.py 2>&1 | tail -2 | tee $OUT/tests.txt
for cfg in "pallas 128 64" "xla 128 64" "pallas 512 16" "xla 512 16"; do set -- $cfg
  python benchmarks/train_step.py --config large --kernels $1 --seq-len $2 --batch-size $3 --steps 10 --repeats 3 \
    --warmup 2 2>&1 | grep -v Warning | tail -1 | tee -a $OUT/step.txt
done
