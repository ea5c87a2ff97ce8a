"""Hugging Face BERT pre-training in PyTorch (eager and `torch.compile`) against jaxformer's train step, on the same
GPU in one process, on the same synthetic batches.

    PYTHONPATH=. python benchmarks/compare_pytorch.py --config large --seq-len 128 --batch-size 64
    PYTHONPATH=. python benchmarks/compare_pytorch.py --config large --seq-len 512 --batch-size 16 --json s512.json
    PYTHONPATH=. python benchmarks/compare_pytorch.py --modes eager,compile,compile-masked,jaxformer
    PYTHONPATH=. python benchmarks/compare_pytorch.py --config tiny --quick          # a smoke run, CPU included

Modes (`--modes`, run in the order given):
* `eager`, `compile`: `transformers.BertForPreTraining`, randomly initialised from a `transformers.BertConfig` of the
  jaxformer preset (`jaxformer.hf.hf_config`; no hub access), SDPA attention, dropout as the preset's (0.1), fp32
  parameters under bf16 autocast, fused AdamW (BERT's betas and eps, weight decay 0.01 off biases and layer norms)
  after clipping to global norm 1.0, as jaxformer's step does; its own loss: the MLM cross-entropy with labels at
  jaxformer's masked positions (-100 elsewhere) plus NSP. Stock Hugging Face decodes every position (B x S x V
  logits) to take the loss at the masked ones; `compile` runs the model under `torch.compile` (`--compile-backend`).
* `eager-masked`, `compile-masked`: the same model with the MLM head applied to the gathered masked positions only
  (B x P x V logits), as jaxformer and NVIDIA's BERT do: the PyTorch side without its largest avoidable cost.
* `jaxformer`: benchmarks/train_step.py's step (`main`, in this process), `--kernels` (default auto: the fused
  Pallas kernels on a GPU).

Every mode times `--steps` back-to-back steps after `--warmup`, `--repeats` times, and takes the median: PyTorch by
CUDA events around the steps (wall clock on the CPU), jaxformer by its wall clock around steps chained through the
donated state (the device never waits for the host in either). Prints a table (seq/s, ms/step, each mode's seq/s
over jaxformer's, the first step's seconds, peak memory) and, with `--json [FILE]`, the rows as JSON (stdout for no
FILE). `tflops`/`mfu` count the same model flop for every mode (benchmarks/train_step.model_flop: the MLM decoder at
the masked positions only), so stock Hugging Face's all-position decoder is work it does beyond that count.

JAX runs here without preallocating the GPU's memory (XLA_PYTHON_CLIENT_PREALLOCATE=false unless set), so that
PyTorch's allocator and XLA's share the GPU; each mode frees its memory before the next.
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # before anything imports jax

import argparse  # noqa: E402
import gc  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

TORCH_MODES = ("eager", "compile", "eager-masked", "compile-masked")
MODES = TORCH_MODES + ("jaxformer",)


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="large", help="jaxformer preset: tiny, mini, base, large")
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--modes", default="eager,compile,jaxformer", help=f"comma-separated, of {', '.join(MODES)}")
    ap.add_argument("--kernels", default="auto", help="jaxformer's kernels (train_step.py's --kernels)")
    ap.add_argument("--dropout", type=float, default=None, help="both dropout rates, both sides (default: 0.1)")
    ap.add_argument("--compile-backend", default="inductor",
                    help="torch.compile's backend for the compile modes (eager: Dynamo's tracing alone, for tests)")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="1 step timed after the first, no GEMM probe: a smoke run")
    ap.add_argument("--json", nargs="?", const="-", default=None, metavar="FILE",
                    help="also write the result as JSON to FILE (no FILE: stdout, after the table)")
    a = ap.parse_args(argv)
    a.modes = [m.strip() for m in a.modes.split(",") if m.strip()]
    bad = [m for m in a.modes if m not in MODES]
    if bad or not a.modes:
        ap.error(f"--modes {','.join(a.modes)!r}: unknown {bad}; choose from {', '.join(MODES)}")
    for f in ("seq_len", "batch_size", "steps", "repeats"):
        if getattr(a, f) < 1:
            ap.error(f"--{f.replace('_', '-')} {getattr(a, f)} must be at least 1")
    if a.warmup < 0:
        ap.error(f"--warmup {a.warmup} must be at least 0")
    if a.quick:
        a.steps, a.warmup, a.repeats = 1, 0, 1
    from jaxformer.config import BertConfig
    if a.config not in BertConfig.preset_names():
        ap.error(f"--config {a.config!r} is unknown; choose one of {', '.join(BertConfig.preset_names())}")
    missing = [m for m in ("torch", "transformers") if importlib.util.find_spec(m) is None]
    if missing and any(m in TORCH_MODES for m in a.modes):
        ap.error(f"--modes {','.join(a.modes)} needs {' and '.join(missing)} installed; or --modes jaxformer")
    return a


def model_config(a):
    """jaxformer's BertConfig of the run, as benchmarks/train_step.py builds it."""
    from jaxformer.config import TrainConfig
    return TrainConfig(config=a.config, seq_len=a.seq_len, batch_size=a.batch_size, dropout=a.dropout).model_config(
        30522)


def masked_positions_count(seq_len: int) -> int:
    return max(1, round(0.15 * seq_len))  # as benchmarks/train_step.py


def torch_batches(cfg, a, device) -> list[dict]:
    """benchmarks/train_step.py's four synthetic batches (jaxformer.data.synthetic_batch, seeds 0-3) as torch
    tensors, with Hugging Face's MLM labels: the masked label at each masked position, -100 elsewhere (a position
    drawn twice holds one label: the synthetic batch draws positions with replacement)."""
    import torch

    from jaxformer.data import synthetic_batch
    out = []
    for seed in range(4):
        b = synthetic_batch(cfg.vocab_size, a.batch_size, a.seq_len, masked_positions_count(a.seq_len), seed)
        labels = np.full(b["input_ids"].shape, -100, np.int64)
        labels[np.arange(a.batch_size)[:, None], b["masked_positions"]] = b["masked_labels"]
        t = {k: torch.from_numpy(np.asarray(v, np.int64)).to(device) for k, v in b.items()
             if k in ("input_ids", "token_type_ids", "attention_mask", "masked_positions", "masked_labels",
                      "nsp_labels")}
        t["labels"] = torch.from_numpy(labels).to(device)
        out.append(t)
    return out


def hf_model(cfg, device):
    """`transformers.BertForPreTraining` of `cfg`'s architecture, random init, fp32 parameters, SDPA attention."""
    import torch
    import transformers

    from jaxformer.hf import hf_config
    fields = {k: v for k, v in hf_config(cfg).items() if k not in ("architectures", "model_type", "dtype")}
    config = transformers.BertConfig(**fields, attn_implementation="sdpa")
    torch.manual_seed(0)
    model = transformers.BertForPreTraining(config).to(device)
    if model.config._attn_implementation != "sdpa":
        raise RuntimeError(f"transformers chose attention {model.config._attn_implementation!r}, not 'sdpa'")
    return model.train()


def pretraining_module(model, masked: bool):
    """A torch module batch -> loss: Hugging Face's own forward and loss (MLM logits at every position, labels -100
    off the masked ones), or (`masked`) the encoder, then the heads on the gathered masked positions only."""
    import torch
    import torch.nn.functional as F

    class Stock(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, b):
            return self.model(input_ids=b["input_ids"], token_type_ids=b["token_type_ids"],
                              attention_mask=b["attention_mask"], labels=b["labels"],
                              next_sentence_label=b["nsp_labels"]).loss

    class Masked(Stock):
        def forward(self, b):
            seq, pooled = self.model.bert(input_ids=b["input_ids"], token_type_ids=b["token_type_ids"],
                                          attention_mask=b["attention_mask"], return_dict=False)[:2]
            pos = b["masked_positions"]  # (B, P)
            h = torch.gather(seq, 1, pos[:, :, None].expand(-1, -1, seq.shape[-1]))  # (B, P, D)
            scores, nsp = self.model.cls(h, pooled)
            mlm = F.cross_entropy(scores.reshape(-1, scores.shape[-1]).float(), b["masked_labels"].reshape(-1))
            return mlm + F.cross_entropy(nsp.float(), b["nsp_labels"])

    return Masked() if masked else Stock()


def adamw(model):
    """AdamW as jaxformer's make_optimizer: betas (0.9, 0.999), eps 1e-6, weight decay 0.01 off biases and layer
    norms; fused (one kernel per step on a GPU)."""
    import torch
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (no_decay if p.ndim < 2 or "LayerNorm" in name or name.endswith("bias") else decay).append(p)
    groups = [dict(params=decay, weight_decay=0.01), dict(params=no_decay, weight_decay=0.0)]
    return torch.optim.AdamW(groups, lr=1e-4, betas=(0.9, 0.999), eps=1e-6, fused=True)


def time_torch(step, batches, steps: int, warmup: int, repeats: int, device) -> tuple[float, list[float], float]:
    """(the first step's seconds, each repeat's seconds per step, the last loss): `steps` back-to-back steps per
    repeat, timed by CUDA events on a GPU (wall clock elsewhere), after the first step and `warmup` more."""
    import torch
    cuda = device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    t0 = time.perf_counter()
    loss = step(batches[0])
    sync()
    first_s = time.perf_counter() - t0
    for i in range(warmup):
        loss = step(batches[i % len(batches)])
    sync()
    times = []
    for _ in range(repeats):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        t = time.perf_counter()
        for i in range(steps):
            loss = step(batches[i % len(batches)])
        if cuda:
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3 / steps)
        else:
            times.append((time.perf_counter() - t) / steps)
    return first_s, times, float(loss)


def run_torch(mode: str, a, cfg) -> dict:
    """One PyTorch mode's row; its model, optimizer state and batches freed before the next mode."""
    import torch
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    out = _run_torch(mode, a, cfg, device)
    if mode.startswith("compile"):
        torch._dynamo.reset()  # its caches hold the compiled module, and with it the model
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return out


def _run_torch(mode: str, a, cfg, device) -> dict:
    import torch
    model = hf_model(cfg, device)
    module = pretraining_module(model, masked=mode.endswith("-masked"))
    if mode.startswith("compile"):
        module = torch.compile(module, backend=a.compile_backend)
    opt = adamw(model)
    batches = torch_batches(cfg, a, device)

    def step(b):
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = module(b)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    first_s, times, loss = time_torch(step, batches, a.steps, a.warmup, a.repeats, device)
    peak = torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else None
    step_s = statistics.median(times)
    return dict(mode=mode, system=f"Hugging Face {'torch.compile' if mode.startswith('compile') else 'eager'}"
               + (", MLM head at the masked positions" if mode.endswith("-masked") else ""),
               ms_per_step=step_s * 1e3, seq_per_s=a.batch_size / step_s, first_step_s=first_s,
               spread_ms=[round(x * 1e3, 2) for x in times], loss=loss, peak_memory_gib=peak,
               device=torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
               attention=model.config._attn_implementation,
               compile_backend=a.compile_backend if mode.startswith("compile") else None)


def run_jaxformer(a) -> dict:
    from benchmarks import train_step
    argv = ["--config", a.config, "--seq-len", str(a.seq_len), "--batch-size", str(a.batch_size),
            "--kernels", a.kernels, "--steps", str(a.steps), "--warmup", str(a.warmup), "--repeats", str(a.repeats)]
    if a.dropout is not None:
        argv += ["--dropout", str(a.dropout)]
    if a.quick:
        argv += ["--gemm", "none"]
    r = train_step.main(argv, quiet=True)
    keep = ("ms_per_step", "seq_per_s", "spread_ms", "loss", "peak_memory_gib", "device", "jax", "kernels",
            "tflops", "mfu", "mfu_measured", "gemm_tflops")
    out = dict(mode="jaxformer", system=f"jaxformer (--kernels {a.kernels})", first_step_s=r["compile_s"],
               **{k: r.get(k) for k in keep})
    gc.collect()
    return out


def table(rows: list[dict]) -> str:
    base = next((r["seq_per_s"] for r in rows if r["mode"] == "jaxformer"), None)
    lines = ["| mode | system | seq/s | ms/step | vs jaxformer | first step s | peak GiB | TFLOP/s | MFU |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ratio = f"{r['seq_per_s'] / base:.2f}x" if base else "-"
        mem = f"{r['peak_memory_gib']:.1f}" if r.get("peak_memory_gib") else "-"
        mfu = f"{100 * r['mfu']:.1f}%" if r.get("mfu") else "-"
        lines.append(f"| {r['mode']} | {r['system']} | {r['seq_per_s']:.1f} | {r['ms_per_step']:.2f} | {ratio} | "
                     f"{r['first_step_s']:.1f} | {mem} | {r['tflops']:.1f} | {mfu} |")
    return "\n".join(lines)


def main(argv=None) -> dict:
    a = parse_args(argv)
    cfg = model_config(a)
    from benchmarks.train_step import flop_rates, model_flop
    flop = model_flop(cfg, a.seq_len, a.batch_size)
    rows = []
    for mode in a.modes:
        print(f"compare_pytorch: {mode} ...", file=sys.stderr, flush=True)
        r = run_jaxformer(a) if mode == "jaxformer" else run_torch(mode, a, cfg)
        if mode != "jaxformer":  # the same model flop for every mode (train_step.model_flop)
            rates = flop_rates(flop, r["ms_per_step"] / 1e3, 1, r["device"], None)
            r.update(tflops=rates["tflops"], mfu=rates["mfu"])
        rows.append(r)
    base = next((r["seq_per_s"] for r in rows if r["mode"] == "jaxformer"), None)
    for r in rows:
        r["vs_jaxformer"] = r["seq_per_s"] / base if base else None
    import jax
    versions = dict(jax=jax.__version__)
    try:
        import torch
        import transformers
        versions.update(torch=torch.__version__, transformers=transformers.__version__)
    except ImportError:
        pass
    result = dict(config=a.config, seq_len=a.seq_len, batch_size=a.batch_size,
                  masked_per_seq=masked_positions_count(a.seq_len), dropout=cfg.hidden_dropout_prob,
                  steps=a.steps, warmup=a.warmup, repeats=a.repeats, model_tflop_per_step=flop / 1e12,
                  **versions, rows=rows)
    print(f"# BERT-{a.config} pre-training, S={a.seq_len}, batch {a.batch_size}, "
          f"{masked_positions_count(a.seq_len)} masked per sequence, dropout {cfg.hidden_dropout_prob}; "
          f"median of {a.repeats} x {a.steps} steps; {', '.join(f'{k} {v}' for k, v in versions.items())}")
    print(table(rows), flush=True)
    if a.json == "-":
        print(json.dumps(result))
    elif a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    main()
