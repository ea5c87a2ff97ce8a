"""Session 13: where BERT-large's train step spends its device time now that the encoder layers run in a loop (the
default since session 12 on one device): per-kernel device time of the compiled step with the Pallas kernels (run
with XLA's command buffers off), grouped by kind, the top kernels, and the broadcast fusions' sum. Session 12's
step_profile.py `profile` mode, without its scan/loop A/B mode.

    XLA_FLAGS=--xla_gpu_enable_command_buffer= PYTHONPATH=. \
        python benchmarks/gpu_scripts/session13/step_profile.py profile 128 64
"""
import collections
import re
import sys

import jax

from jaxformer.config import TrainConfig
from jaxformer.data import synthetic_batch
from jaxformer.steps import Steps, build_model, make_optimizer


def build(s, b, config="large"):
    tc = TrainConfig(config=config, seq_len=s, batch_size=b, kernels="pallas", steps=1000, warmup_steps=10,
                     mesh="data=-1")
    cfg = tc.model_config(30522)
    model = build_model(cfg, 0)
    steps = Steps(model, make_optimizer(tc), tc, None)
    state = steps.place(steps.init_state(model, 0))
    p = max(1, round(0.15 * s))
    batches = [steps.place_batch(synthetic_batch(cfg.vocab_size, b, s, p, seed)) for seed in range(4)]
    return steps, state, batches


def main(mode, s, b):
    print(f"# {jax.devices()[0].device_kind}, jax {jax.__version__}, mode {mode}, S{s} B{b}", flush=True)
    if mode == "profile":  # the only mode
        from jaxformer.hlo_profile import profile_compiled
        steps, state, batches = build(s, b)
        compiled = steps.train_step.compile(state, batches[0])
        times = profile_compiled(compiled, (state, batches[0]), 3, carry=lambda out, args: (out[0], args[1]),
                                 log=lambda m: print("  " + m), by="both")
        total = sum(times.values()) / 3 / 1e3
        print(f"  kernels summed: {total:.1f} us per step")
        groups = collections.defaultdict(float)
        for k, ns in times.items():
            groups[re.sub(r"[._]\d+", "", k.split(":")[-1].strip())] += ns / 3 / 1e3
        print("  by kind (us per step):")
        for k, us in sorted(groups.items(), key=lambda kv: -kv[1])[:25]:
            print(f"  {us:10.1f}  {100 * us / total:5.1f}%  {k[:100]}")
        print("  top kernels:")
        for k, ns in sorted(times.items(), key=lambda kv: -kv[1])[:40]:
            print(f"  {ns / 3 / 1e3:10.1f}  {k[:140]}")
        zf = sum(ns for k, ns in times.items() if "broadcast" in k) / 3 / 1e3
        print(f"  broadcast fusions (zero-fills) summed: {zf:.1f} us per step", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
