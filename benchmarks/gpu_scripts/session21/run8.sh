# Session 21 run 8: size-matched copies (device time); Mosaic GPU BDRLN block sizes at 768 wide; the train step.
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=benchmarks/gpu_scripts/session21/ab_rowwise.py
python $S --copies 2>&1 | grep -v Warning | tee $OUT/copies.txt
python $S --sweep --shapes 16384x768,32768x768 2>&1 | grep -v Warning | tee $OUT/sweep768.txt
python benchmarks/train_step.py --config large --kernels pallas --seq-len 128 --batch-size 64 --steps 10 --repeats 3 --warmup 2 2>&1 | grep -v Warning | tail -8 | tee $OUT/step.txt
