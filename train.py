"""BERT pre-training (MLM + NSP) from the command line.

With no flags: the `tiny` preset on the built-in corpus (the Python standard library's documentation), a few
minutes on a 2-core CPU. Point `--data` at your own corpus and pick a larger `--config` on a GPU: a directory
prepared once with `python -m jaxformer.prepare` (starts in seconds whatever its size), or text (BERT format: one
sentence per line, a blank line between documents; or .jsonl with a "text" field), prepared on the fly into a cache
that later runs reuse (docs/training.md, Data).

The flags are TrainConfig's fields (jaxformer/config.py; the table: docs/cli.md). The run itself is
jaxformer.trainer.train.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time


def parse_args(argv=None) -> argparse.Namespace:
    """The flags, by field name: `TrainConfig(**vars(parse_args(argv)))` is the run's configuration."""
    from jaxformer.cli import parser
    from jaxformer.config import TrainConfig
    return parser(TrainConfig, prog="train.py", description=__doc__).parse_args(argv)


def config(argv=None):
    """The run's TrainConfig: the flags, or with `--resume` the run's stored configuration (run.json) with the
    flags given laid over it."""
    args = parse_args(argv)
    from jaxformer.config import TrainConfig
    if not args.resume:
        return TrainConfig(**vars(args))
    from jaxformer import run
    from jaxformer.cli import given
    return run.resumed_config(given(TrainConfig, argv, prog="train.py"))


def main(argv=None) -> int:
    started = time.perf_counter()  # the start-up time logged at the first step counts from here
    try:
        tc = config(argv)
        from jaxformer.trainer import Interrupted, TrainingStopped, train
        try:
            summary = train(tc, started=started)
        except Interrupted as e:  # Ctrl-C in the loop: a checkpoint was saved
            print(f"train.py: {e}", file=sys.stderr)
            return 130
        except TrainingStopped as e:  # a non-finite loss
            print(f"train.py: error: {e}", file=sys.stderr)
            return 2
    except ValueError as e:  # bad input, a run that cannot be resumed as asked
        print(f"train.py: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\ntrain.py: interrupted before training started; nothing was saved", file=sys.stderr)
        return 130
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
    print(f"outputs: {summary['out']} (run.json, metrics.jsonl, loss.png, tokenizer.json, checkpoints/)")
    out = shlex.quote(summary["out"])
    if summary["step"] < summary["total_steps"]:
        print(f"continue: python train.py --out {out} --resume")
    else:
        print(f"extend: python train.py --out {out} --resume --steps {summary['step'] * 2} (the learning rate "
              f"goes on from its last value, {summary['final_lr']:.2g}, down to 0: docs/training.md)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
