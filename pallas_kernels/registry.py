"""Which implementation runs each fused operator: one ordered list of implementations per operator.

Every implementation answers, for one call (the per-shard shapes, dtype, dropout and mesh, as a small frozen
dataclass of its operator's) on one `Device`, whether it supports it, and if not why (`Skip`); it gives its default
config (block sizes) and its tunable candidates. `choose` runs the first implementation in the operator's order that
supports the call, unless the caller names one; the autotuner (`pallas_kernels.autotune`) times the implementations
that can run (`runnable`). A skipped implementation is logged once per (operator, reason), as a warning where the
call leaves the Pallas kernels altogether.

    choice = registry.choose("bias_gelu", bias_gelu.Call(rows=8192, width=4096, dtype="bfloat16", rate=0.0),
                             Device.named("h100"))
    choice.impl.name, choice.config, choice.skipped
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
from typing import Any, Callable, Sequence

import jax

log = logging.getLogger("pallas_kernels")


@dataclasses.dataclass(frozen=True)
class Device:
    """What the rules know of a device: jax's platform ("gpu", "cpu", ...), device kind and compute capability."""

    platform: str
    kind: str = ""
    compute_capability: tuple[int, int] | None = None

    @classmethod
    def current(cls) -> "Device":
        """The default backend's first device."""
        platform = jax.default_backend()
        try:
            device = jax.devices()[0]
            kind = str(device.device_kind)
            cc = getattr(device, "compute_capability", None)
            cc = None if cc is None else tuple(int(p) for p in str(cc).split(".")[:2])
        except Exception:  # no runtime to ask, or an odd version string: no Hopper kernels
            kind, cc = "", None
        return cls(platform, kind, cc)

    @classmethod
    def named(cls, name: str) -> "Device":
        """"current", or one of `DEVICES` (rules can be computed for a GPU on any machine)."""
        if name == "current":
            return cls.current()
        if name not in DEVICES:
            raise ValueError(f"device {name!r} must be 'current' or one of {sorted(DEVICES)}")
        return DEVICES[name]

    @property
    def hopper(self) -> bool:
        """A GPU of compute capability 9.0 or newer (what the Mosaic GPU kernels need)."""
        return self.platform == "gpu" and self.compute_capability is not None and self.compute_capability >= (9, 0)

    def __str__(self) -> str:
        cc = self.compute_capability
        cc = "" if cc is None else f", compute capability {'.'.join(map(str, cc))}"
        if not self.kind or self.kind == self.platform:
            return self.platform + cc.replace(",", "", 1)
        return f"{self.kind} ({self.platform}{cc})"


DEVICES = {
    "h200": Device("gpu", "NVIDIA H200", (9, 0)),
    "h100": Device("gpu", "NVIDIA H100 80GB HBM3", (9, 0)),
    "cpu": Device("cpu", "cpu"),
}


@dataclasses.dataclass(frozen=True)
class Skip:
    """Why an implementation does not run a call. `kind`: "device" (not this device), "call" (not this shape, dtype
    or mesh) or "slower" (it runs, but measured slower there than the next one: the autotuner still times it)."""

    reason: str
    kind: str = "call"


NEEDS_HOPPER = Skip("needs a Hopper-or-newer GPU (compute capability >= 9.0)", "device")


class Implementation:
    """One way to compute an operator. `kernel`: Pallas kernels (else XLA runs it: the reference, or pure JAX).
    `supports` judges the call before the device, so that a named implementation's call is checked in interpret
    mode too."""

    name: str = ""
    kernel: bool = True
    summary: str = ""  # one line for the table (`python -m jaxformer.ops --table`)

    def supports(self, call, device: Device) -> Skip | None:
        return None

    def default(self, call, device: Device):
        """The default config (block sizes) for the call; None where there is nothing to configure."""
        return None

    def candidates(self, config, call, device: Device, stage: str) -> list:
        """Configs the autotuner tries around `config`: stage "fwd" the forward's, "bwd" the backward's."""
        return []

    def __repr__(self) -> str:
        return f"<{self.name}>"


class Reference(Implementation):
    """An XLA implementation: `fn` in jax.numpy (the operator's reference, or another pure-JAX form)."""

    kernel = False

    def __init__(self, fn: Callable, name: str = "xla", summary: str = "the jax.numpy reference (XLA fuses it)"):
        self.fn, self.name, self.summary = fn, name, summary


@dataclasses.dataclass(frozen=True)
class Choice:
    """The implementation that runs a call, its config, and the implementations skipped before it with why."""

    impl: Implementation
    config: Any = None
    skipped: tuple[tuple[str, Skip], ...] = ()

    def __eq__(self, other):  # the skipped list explains the choice; it is not part of what runs
        return isinstance(other, Choice) and (self.impl, self.config) == (other.impl, other.config)

    def __hash__(self):
        return hash((self.impl, self.config))


@dataclasses.dataclass(frozen=True)
class Operator:
    """An operator's implementations by name, and `order`: the ones `kernels="pallas"` tries, first choice first.
    Implementations not in `order` run only when named."""

    name: str
    summary: str
    implementations: tuple[Implementation, ...]
    order: tuple[str, ...]

    def __post_init__(self):
        names = [i.name for i in self.implementations]
        if len(set(names)) != len(names) or not set(self.order) <= set(names) or "xla" not in names:
            raise ValueError(f"operator {self.name}: implementations {names} must be unique, include 'xla' and "
                             f"cover the order {self.order}")

    def implementation(self, name: str) -> Implementation:
        for impl in self.implementations:
            if impl.name == name:
                return impl
        raise ValueError(f"impl={name!r} must be one of {[i.name for i in self.implementations]} for {self.name}")


_OPERATORS: dict[str, Operator] = {}
# The modules that register the operators (each calls `register` on import).
_MODULES = ("pallas_kernels.embedding_layernorm", "pallas_kernels.attention", "pallas_kernels.bias_gelu",
            "pallas_kernels.gelu_dense", "pallas_kernels.bias_dropout_residual_layernorm", "pallas_kernels.softmax",
            "pallas_kernels.mlm_loss")


def register(op: Operator) -> Operator:
    _OPERATORS[op.name] = op
    return op


def operators() -> dict[str, Operator]:
    """Every registered operator, by name."""
    for module in _MODULES:
        importlib.import_module(module)
    return dict(_OPERATORS)


def operator(name: str) -> Operator:
    ops = _OPERATORS if name in _OPERATORS else operators()
    if name not in ops:
        raise ValueError(f"operator {name!r} must be one of {sorted(ops)}")
    return ops[name]


def choose(op: str, call, device: Device | None = None, *, impl: str | None = None, blocks=None,
           interpret: bool = False, log_skips: bool = True) -> Choice:
    """The implementation and config that run `call` of operator `op` on `device` (default: the current one).

    `impl` names one (it must support the call; its device requirement is waived in interpret mode, which emulates
    the device on the CPU); else the first in the operator's order that supports it. `blocks` replaces the default
    config; without `impl`, they name the first implementation in the order whose config is of their class and
    which runs the call on the device (a rule that prefers another there does not apply)."""
    operator_ = operator(op)
    device = Device.current() if device is None else device
    if impl is not None:
        chosen = operator_.implementation(impl)
        skip = chosen.supports(call, device)
        if skip is not None and (skip.kind == "call" or skip.kind == "device" and not interpret):
            raise ValueError(f"impl={impl!r} does not run this {op} call ({_fields(call)}) on {device}: {skip.reason}")
        return Choice(chosen, chosen.default(call, device) if blocks is None else blocks)
    skipped = []
    for name in operator_.order:
        candidate = operator_.implementation(name)
        skip = candidate.supports(call, device)
        if blocks is not None:
            if skip is not None and skip.kind == "slower":
                skip = None
            if skip is None and type(candidate.default(call, device)) is not type(blocks):
                skip = Skip(f"blocks={type(blocks).__qualname__} are not its config")
        if skip is None:
            choice = Choice(candidate, candidate.default(call, device) if blocks is None else blocks, tuple(skipped))
            if log_skips and blocks is None:
                _log_skips(op, choice)
            return choice
        skipped.append((name, skip))
    reasons = "; ".join(f"{name}: {skip.reason}" for name, skip in skipped)
    raise ValueError(f"no implementation of {op} runs this call ({_fields(call)}) on {device}: {reasons}")


def runnable(op: str, call, device: Device, first: Choice) -> list[Choice]:
    """`first` (the registry's choice), then every other implementation in the order that can run the call (its
    skip, if any, is "slower"), with its default config: what the autotuner times."""
    out = [first]
    for name in operator(op).order:
        impl = operator(op).implementation(name)
        skip = impl.supports(call, device)
        if impl is not first.impl and impl.kernel and (skip is None or skip.kind == "slower"):
            out.append(Choice(impl, impl.default(call, device)))
    return out


_LOGGED: set = set()


def _log_skips(op: str, choice: Choice) -> None:
    """Each skipped implementation's reason, once per (operator, reason): a warning where the choice leaves the
    Pallas kernels (a fallback to XLA or pure JAX), else at info level (the rules' ordinary choice)."""
    left_kernels = not choice.impl.kernel and any(operator(op).implementation(n).kernel for n, _ in choice.skipped)
    for name, skip in choice.skipped:
        if (op, skip.reason) in _LOGGED:
            continue
        _LOGGED.add((op, skip.reason))
        log.log(logging.WARNING if left_kernels else logging.INFO, "%s: %s skipped (%s); running %s", op, name,
                skip.reason, choice.impl.name)


def _fields(call) -> str:
    return ", ".join(f"{k}={v}" for k, v in dataclasses.asdict(call).items())


def describe(choice: Choice) -> Sequence[str]:
    """Lines saying what runs and why the implementations before it were skipped."""
    lines = [f"runs {choice.impl.name}" + ("" if choice.config is None else f" with {choice.config}")]
    lines += [f"skipped {name}: {skip.reason}" for name, skip in choice.skipped]
    return lines
