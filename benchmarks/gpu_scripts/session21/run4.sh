# Session 21 run 4: compiled tests of this session's kernel changes and of session 20's untested code.
export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/gpu.txt
python -m pytest -q -m gpu tests/test_mgpu.py tests/test_kernels.py -p no:warnings 2>&1 | tail -4 | tee $OUT/tests_rowwise.txt
python -m pytest -q -m gpu tests/test_attention_kernel.py -k "variant8 or variant9 or loops_over_heads" -p no:warnings 2>&1 | tail -4 | tee $OUT/tests_attn.txt
