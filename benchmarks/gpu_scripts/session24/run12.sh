# Session 24, run 12 (H100): the README's BERT-large train-step table on main's head (the H100 rows, last measured in
# session 20).
bash benchmarks/gpu_scripts/session24/run6.sh
