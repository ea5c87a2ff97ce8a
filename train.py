"""BERT pre-training (MLM + NSP) from the command line.

With no flags: the `tiny` preset on the built-in corpus (the Python standard library's documentation), a few
minutes on a 2-core CPU. Point `--data` at your own corpus (BERT text format: one sentence per line, a blank line
between documents; or .jsonl with a "text" field) and pick a larger `--config` on a GPU.
"""

from __future__ import annotations

import argparse
import sys


def _profile_steps(text: str) -> tuple[int, int]:
    try:
        a, b = (int(x) for x in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--profile-steps {text!r}: expected A:B, e.g. 10:15") from None
    return a, b


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="train.py", description=__doc__,
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--config", default="tiny", help="model preset: tiny, mini, base, large")
    p.add_argument("--data", nargs="+", default=None,
                   help="corpus: file(s), directory or glob of BERT-format text or .jsonl; default: built-in corpus")
    p.add_argument("--vocab", default=None,
                   help="BERT vocab.txt or tokenizer.json; default: train a WordPiece tokenizer on the corpus "
                        "(saved as <out>/tokenizer.json)")
    p.add_argument("--vocab-size", type=int, default=None,
                   help="size of the tokenizer to train (default 4096); with --vocab, must match it")
    p.add_argument("--seq-len", type=int, default=128, help="tokens per sequence")
    p.add_argument("--max-predictions", type=int, default=None,
                   help="masked positions per sequence (default 15%% of --seq-len)")
    p.add_argument("--batch-size", type=int, default=32, help="global batch size (sequences per step)")
    p.add_argument("--steps", type=int, default=600, help="total training steps")
    p.add_argument("--lr", type=float, default=None,
                   help="peak learning rate (default per preset: tiny 2e-3, mini 1e-3, base and large 1e-4)")
    p.add_argument("--warmup-steps", type=int, default=60, help="linear warm-up steps")
    p.add_argument("--schedule", choices=("linear", "polynomial"), default="linear", help="decay after warm-up")
    p.add_argument("--optimizer", choices=("adamw", "lamb"), default="adamw", help="optimizer")
    p.add_argument("--weight-decay", type=float, default=0.01,
                   help="decoupled weight decay (not on biases and layernorm parameters)")
    p.add_argument("--clip-norm", type=float, default=1.0, help="clip gradients to this global norm (0: off)")
    p.add_argument("--dropout", type=float, default=None,
                   help="overrides both dropout probabilities (0 makes a run deterministic); default: the preset's 0.1")
    p.add_argument("--seed", type=int, default=0, help="seed of initialisation, data order, masking and dropout")
    p.add_argument("--out", default=None, help="output directory (default runs/<timestamp>)")
    p.add_argument("--resume", action="store_true",
                   help="continue from the latest checkpoint in --out (default: the most recent run under runs/)")
    p.add_argument("--eval-every", type=int, default=200, help="evaluate on the held-out split every N steps")
    p.add_argument("--eval-batches", type=int, default=20, help="held-out batches per evaluation")
    p.add_argument("--save-every", type=int, default=200, help="checkpoint every N steps (and at the end)")
    p.add_argument("--log-every", type=int, default=20, help="write metrics every N steps")
    p.add_argument("--kernels", choices=("auto", "xla", "pallas"), default="auto",
                   help="implementation of the fused operators: auto = pallas on a GPU, xla elsewhere "
                        "(see jaxformer/ops.py)")
    p.add_argument("--dtype", default="bfloat16", help="compute dtype: bfloat16, float32 or float16")
    p.add_argument("--remat", choices=("none", "full", "dots"), default="none",
                   help="recompute layer activations in the backward pass to save memory")
    p.add_argument("--scan-layers", action=argparse.BooleanOptionalAction, default=False,
                   help="run the encoder layers in one lax.scan (--scan-layers: compiles ~4x faster for BERT-large, "
                        "steps 20-28%% slower on one GPU and on two) instead of a loop over them (the default)")
    p.add_argument("--layouts", default="default", metavar="FILE",
                   help="stored order of the encoder layer's activations: a JSON file written by "
                        "`python -m jaxformer.layout_search`, or a built-in name (README, Layouts)")
    p.add_argument("--profile-steps", type=_profile_steps, default=None, metavar="A:B",
                   help="write a jax.profiler trace of steps A..B-1 to <out>/profile")
    p.add_argument("--dump-hlo", action="store_true", help="write the optimized HLO of the train step to <out>")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (logs only)")
    p.add_argument("--mesh", default="data=-1",
                   help="device mesh, e.g. data=2,tensor=4: axes data, fsdp (ZeRO-3), tensor (Megatron), pipeline; "
                        "an axis left out has size 1, one may be -1 (the rest); see README, Distributed training")
    p.add_argument("--microbatches", type=int, default=1, help="microbatches per step (pipeline schedule)")
    p.add_argument("--pipeline-repeats", type=int, default=1,
                   help="layer chunks per pipeline stage (circular pipeline schedule)")
    p.add_argument("--sequence-parallel", action="store_true",
                   help="with tensor > 1: split the residual stream's sequence axis over `tensor` between blocks "
                        "(Megatron sequence parallelism; runs the XLA kernels)")
    p.add_argument("--xla-opt-level", choices=("auto", "default", "O0", "O1", "O2", "O3"), default="auto",
                   help="XLA's optimization level for the train step; auto: O2 with data or fsdp > 1 (measured "
                        "faster there), JAX's default otherwise")
    p.add_argument("--xla-gemm", choices=("auto", "xla", "cublas"), default="auto",
                   help="who runs the GEMMs on a GPU: xla (XLA's choice per GEMM, Triton or cuBLAS), cublas (XLA's "
                        "Triton GEMMs off); auto: cublas on one device (measured faster with the kernels, equal "
                        "without; README, Measured), xla on a mesh of several devices")
    p.add_argument("--coordinator", default=None, metavar="HOST:PORT",
                   help="multi-process run: address of process 0's coordinator (default: $JAXFORMER_COORDINATOR; "
                        "none and no SLURM step: one process); see README, Multi-host")
    p.add_argument("--num-processes", type=int, default=None,
                   help="multi-process run: number of processes (default: $JAXFORMER_NUM_PROCESSES)")
    p.add_argument("--process-id", type=int, default=None,
                   help="multi-process run: this process's index, 0 .. N-1 (default: $JAXFORMER_PROCESS_ID)")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    from jaxformer.config import TrainConfig
    from jaxformer.trainer import TrainingStopped, train

    try:
        tc = TrainConfig(config=args.config, data=args.data, vocab=args.vocab, vocab_size=args.vocab_size,
                         seq_len=args.seq_len, max_predictions=args.max_predictions, batch_size=args.batch_size,
                         steps=args.steps, lr=args.lr, warmup_steps=args.warmup_steps, schedule=args.schedule,
                         optimizer=args.optimizer, weight_decay=args.weight_decay, clip_norm=args.clip_norm,
                         dropout=args.dropout, seed=args.seed, out=args.out, resume=args.resume,
                         eval_every=args.eval_every, eval_batches=args.eval_batches, save_every=args.save_every,
                         log_every=args.log_every, kernels=args.kernels, dtype=args.dtype, remat=args.remat,
                         scan_layers=args.scan_layers, layouts=args.layouts, profile_steps=args.profile_steps,
                         dump_hlo=args.dump_hlo,
                         progress=not args.no_progress,
                         mesh=args.mesh, microbatches=args.microbatches, pipeline_repeats=args.pipeline_repeats,
                         sequence_parallel=args.sequence_parallel,
                         xla_opt_level=args.xla_opt_level, xla_gemm=args.xla_gemm,
                         coordinator=args.coordinator, num_processes=args.num_processes, process_id=args.process_id)
        summary = train(tc)
    except (ValueError, TrainingStopped) as e:  # bad input, missing checkpoint, non-finite loss, Ctrl-C
        print(f"train.py: error: {e}", file=sys.stderr)
        return 2
    import jax
    if jax.process_index() != 0:  # process 0 reports for a multi-process run
        return 0
    print("\n== done ==")
    print(f"steps: {summary['step']}   final loss {summary['final_loss']:.4f} "
          f"(mlm {summary['final_mlm_loss']:.4f}, nsp {summary['final_nsp_loss']:.4f})")
    if "eval_mlm_acc" in summary:
        print(f"eval: MLM accuracy {summary['eval_mlm_acc']:.3f} (most-frequent-token baseline "
              f"{summary['most_frequent_token_baseline']:.3f}), MLM loss {summary['eval_mlm_loss']:.3f}, "
              f"NSP accuracy {summary['eval_nsp_acc']:.3f}")
    print(f"time waiting for data: {summary['data_wait_s']:.2f}s")
    print(f"outputs: {summary['out']} (metrics.jsonl, loss.png, tokenizer.json, checkpoints/)")
    print(f"continue: python train.py --out {summary['out']} --resume --steps {summary['step'] * 2}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
