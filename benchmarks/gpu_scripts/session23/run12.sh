# Session 23, run 12 (H200): BDRLN's forward with its dropout mask drawn a step ahead (`Blocks.fwd_mask_ahead`): the
# compiled BDRLN Mosaic GPU tests (both forms), then the forward A/B.
python -m pytest -q -m gpu tests/test_mgpu.py -k "bdrln" 2>&1 | tail -1 | tee $OUT/tests.txt
python benchmarks/gpu_scripts/session23/ab_mask_ahead.py 2>&1 | grep -v Warning | tee $OUT/mask_ahead.txt
