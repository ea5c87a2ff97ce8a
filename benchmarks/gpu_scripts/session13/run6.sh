#!/bin/bash
# Session 13 run 6 (one H200): the layer loop's parameter slicing, L slices `a[i]` (old: their gradient is L zero-pads
# summed) vs one `lax.split` per parameter (new: one concatenate), train step A/B alternating, S=128 B64 and S=512
# B16, Pallas kernels; then the new step's per-kernel profile at S=128.
export PYTHONPATH=.
rm -rf /tmp/old && mkdir /tmp/old && cp -r . /tmp/old/ && cd /tmp/old && python - <<'PY'
p = "jaxformer/model.py"; s = open(p).read()
a = s.index("            # One `lax.split` per parameter"); b = s.index("        return lx.annotate(x, layout).to(\"BSD\")", a)
s = s[:a] + """            for index in range(cfg.num_hidden_layers):
                x, _ = body(x, (jax.tree.map(lambda a, i=index: a[i], state), index))
""" + s[b:]
open(p, "w").write(s)
PY
cd - > /dev/null; grep -c "lax.split" jaxformer/model.py /tmp/old/jaxformer/model.py
T="benchmarks/train_step.py --config large --kernels pallas --steps 10 --repeats 3 --warmup 2"
show() { grep -v "^ *$" $1 | grep -iv "warn" | tail -1 | python -c "import json,sys; d=json.loads(sys.stdin.read()); print({k: d[k] for k in ('seq_len','ms_per_step','seq_per_s','spread_ms','compile_s','peak_memory_gib','loss')})"; }
for sb in "128 64" "512 16"; do
  set -- $sb
  for form in old new old new; do
    if [ $form = old ]; then dir=/tmp/old; else dir=$PWD; fi
    (cd $dir && timeout 150 python $T --seq-len $1 --batch-size $2 > $OUT/ab_S$1_$form.log 2>&1)
    echo "S$1 $form rc $?"; show $OUT/ab_S$1_$form.log
    cat $OUT/ab_S$1_$form.log >> $OUT/ab_S$1_${form}_all.log
  done
done
XLA_FLAGS=--xla_gpu_enable_command_buffer= timeout 200 python benchmarks/gpu_scripts/session13/step_profile.py \
    profile 128 64 > $OUT/profile_S128_split.txt 2>&1
echo "profile rc $?"; grep -v "^ *$" $OUT/profile_S128_split.txt | grep -v "Warning\|warn" | head -40 | cut -c1-170
