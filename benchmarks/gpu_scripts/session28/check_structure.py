"""Session 28: `structure.py`'s copy kernels against jax.numpy on fresh random inputs (they must move every byte
they claim to: an unwritten tile would show as a mismatch). Prints one line per case and exits non-zero on any.

    PYTHONPATH=. python benchmarks/gpu_scripts/session28/check_structure.py
"""
import itertools
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import structure  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402


def main():
    bad = 0
    key = jax.random.split(jax.random.key(7), 3)
    for rows, d in ((8192, 768), (16384, 1024)):
        x, r = (jax.random.normal(k, (rows, d), jnp.bfloat16) for k in key[:2])
        v = jnp.zeros((d,))
        dx, dr = jax.jit(lambda a, rows=rows, d=d: structure.bdrln_structure(a, rows=rows, width=d))((x, v, r, v, v))
        y = (x.astype(jnp.float32) + r.astype(jnp.float32)).astype(jnp.bfloat16)
        want = [(x.astype(jnp.float32) + y.astype(jnp.float32)).astype(jnp.bfloat16),
                (r.astype(jnp.float32) + y.astype(jnp.float32)).astype(jnp.bfloat16)]
        ok = all(np.array_equal(np.asarray(g), np.asarray(w)) for g, w in zip((dx, dr), want))
        bad += not ok
        print(f"bdrln structure {rows}x{d}: {'ok' if ok else 'MISMATCH'}", flush=True)
    for (rows, d), direct in itertools.product(((8192, 3072), (16384, 4096)), (False, True)):
        x = jax.random.normal(key[2], (rows, d), jnp.bfloat16)
        dx = jax.jit(lambda a, rows=rows, d=d, direct=direct: structure.gelu_structure(
            a, rows=rows, width=d, direct=direct))((x, jnp.zeros((d,))))
        y = (x.astype(jnp.float32) * 2).astype(jnp.bfloat16)
        want = (x.astype(jnp.float32) + y.astype(jnp.float32)).astype(jnp.bfloat16)
        ok = np.array_equal(np.asarray(dx).reshape(rows, d), np.asarray(want))
        bad += not ok
        print(f"bias_gelu structure{', direct stores' if direct else ''} {rows}x{d}: {'ok' if ok else 'MISMATCH'}",
              flush=True)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
