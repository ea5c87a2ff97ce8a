# Session 25, run 17 (H200): the review mend (shared `_mgpu.seeds`, bias+GELU's `_keep` from the tile index,
# `_mgpu.warpgroup_barrier(auto_barriers=)`, BDRLN's parameter source chosen once) compiled: every Mosaic GPU test.
python -m pytest -q -m gpu tests/test_mgpu.py 2>&1 | tail -1 | tee $OUT/tests.txt
