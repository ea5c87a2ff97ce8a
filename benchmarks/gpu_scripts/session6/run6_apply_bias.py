import sys
root = sys.argv[1]
def edit(p, rep):
    p = root + "/" + p
    s=open(p).read()
    for x,y in rep:
        assert s.count(x)==1,(p,x)
        s=s.replace(x,y)
    open(p,'w').write(s)
edit('pallas_kernels/attention/kernel.py',[
('''def _fwd_kernel(q_ref, k_ref, v_ref, code_ref, seed_ref, o_ref, lse_ref, *, scale, block_k, heads, s_len, rate):''',
 '''def _biased(ref, idx, bias_ref, c):
    x = ref[idx]
    if bias_ref is None:
        return x
    return (x + bias_ref[c, :][None, :]).astype(x.dtype)


def _fwd_kernel(q_ref, k_ref, v_ref, code_ref, seed_ref, bias_ref, o_ref, lse_ref, *, scale, block_k, heads, s_len,
                rate):'''),
('''    q = q_ref[...]

    def body(j, carry):  # online softmax''','''    q = _biased(q_ref, (slice(None), slice(None)), bias_ref, 0)

    def body(j, carry):  # online softmax'''),
('''        s = _scores(q, k_ref[kv, :], code_ref[kv], qk_scale)''','''        s = _scores(q, _biased(k_ref, (kv, slice(None)), bias_ref, 1), code_ref[kv], qk_scale)'''),
('''        v = v_ref[kv, :]''','''        v = _biased(v_ref, (kv, slice(None)), bias_ref, 2)'''),
('''def _dkdv_kernel(q_ref, k_ref, v_ref, code_ref, seed_ref, do_ref, lse_ref, delta_ref, *out_refs,''',
 '''def _dkdv_kernel(q_ref, k_ref, v_ref, code_ref, seed_ref, bias_ref, do_ref, lse_ref, delta_ref, *out_refs,'''),
('''    k, v, code = k_ref[...], v_ref[...], code_ref[...]''','''    every = (slice(None), slice(None))
    k, v, code = _biased(k_ref, every, bias_ref, 1), _biased(v_ref, every, bias_ref, 2), code_ref[...]'''),
('''        q, do = q_ref[rows, :], do_ref[rows, :]''','''        q, do = _biased(q_ref, (rows, slice(None)), bias_ref, 0), do_ref[rows, :]'''),
('''def _dq_kernel(q_ref, k_ref, v_ref, code_ref, seed_ref, do_ref, lse_ref, delta_ref, *refs,''',
 '''def _dq_kernel(q_ref, k_ref, v_ref, code_ref, seed_ref, bias_ref, do_ref, lse_ref, delta_ref, *refs,'''),
('''    q, do, lse, delta = q_ref[...], do_ref[...], lse_ref[...], delta_ref[...]''','''    q = _biased(q_ref, (slice(None), slice(None)), bias_ref, 0)
    do, lse, delta = do_ref[...], lse_ref[...], delta_ref[...]'''),
('''        k = k_ref[kv, :]''','''        k = _biased(k_ref, (kv, slice(None)), bias_ref, 1)'''),
('''        _, ds = _grad_tile(q, k, v_ref[kv, :], do, code_ref[kv], lse, delta, keep,''','''        _, ds = _grad_tile(q, k, _biased(v_ref, (kv, slice(None)), bias_ref, 2), do, code_ref[kv], lse, delta, keep,'''),
('''def _qkv_spec(''','''def _bias_spec(bias):
    return None if bias is None else pl.BlockSpec((3, None, bias.shape[-1]), lambda i, b_, n_: (0, n_, 0))


def _qkv_spec('''),
('''            packed: bool = False):''','''            packed: bool = False, bias=None):'''),
('''                  _seed_spec(seed)],''','''                  _seed_spec(seed), _bias_spec(bias)],'''),
('''    )(q, k, v, code, seed)''','''    )(q, k, v, code, seed, bias)'''),
('''             heads: int | None = None, packed: bool = False):''','''             heads: int | None = None, packed: bool = False, bias=None):'''),
('''                  _seed_spec(seed), seq_full, stat_full, stat_full],''','''                  _seed_spec(seed), _bias_spec(bias), seq_full, stat_full, stat_full],'''),
('''    )(q, k, v, code, seed, do, lse, delta)''','''    )(q, k, v, code, seed, bias, do, lse, delta)'''),
('''                  pl.BlockSpec((None, t), lambda i, b_, n_: (b_, 0)), _seed_spec(seed), row_block, stat_block,
                  stat_block] + ([dq_spec] if packed else []),''','''                  pl.BlockSpec((None, t), lambda i, b_, n_: (b_, 0)), _seed_spec(seed), _bias_spec(bias), row_block,
                  stat_block, stat_block] + ([dq_spec] if packed else []),'''),
('''        input_output_aliases={(8 if seed is not None else 7): 0} if packed else {},  # flat index: a None seed drops''','''        input_output_aliases={7 + (seed is not None) + (bias is not None): 0} if packed else {},'''),
('''    )(q, k, v, code, seed, do, lse, delta, *extra)''','''    )(q, k, v, code, seed, bias, do, lse, delta, *extra)'''),
])
edit('pallas_kernels/attention/__init__.py',[
('''def flash_attention_qkv(qkv, mask, *, seed=None, rate: float = 0.0, interpret: bool | None = None,''',
 '''def flash_attention_qkv(qkv, mask, *, bias=None, seed=None, rate: float = 0.0, interpret: bool | None = None,'''),
('''    return _flash_qkv(qkv, kernel.mask_code(mask), seed, offsets, rate, interpret, blocks, heads)''',
 '''    if bias is not None:
        bias = bias.astype(qkv.dtype)
    return _flash_qkv(qkv, bias, kernel.mask_code(mask), seed, offsets, rate, interpret, blocks, heads)'''),
('''@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6, 7))
def _flash_qkv(qkv, code, seed, offsets, rate, interpret, blocks, heads):
    return _flash_qkv_fwd(qkv, code, seed, offsets, rate, interpret, blocks, heads)[0]


def _flash_qkv_fwd(qkv, code, seed, offsets, rate, interpret, blocks, heads):
    def run(row, head, qkv, code, seed, offsets):
        return kernel.forward(qkv, qkv, qkv, code, _words(seed, offsets, row, head), rate=rate, blocks=blocks,
                              interpret=interpret, heads=heads, packed=True)
    out, lse = batch_shard_map(run, n_batched=2, head_dims=(3, None, None, None), out_head_dim=(2, 1))(
        qkv, code, seed, offsets)
    return out, (qkv, code, seed, offsets, out, lse)


def _flash_qkv_bwd(rate, interpret, blocks, heads, res, do):
    qkv, code, seed, offsets, out, lse = res

    def run(row, head, qkv, code, out, lse, do, seed, offsets):
        return kernel.backward(qkv, qkv, qkv, code, _words(seed, offsets, row, head), out, lse, do, rate=rate,
                               blocks=blocks, interpret=interpret, heads=heads, packed=True)
    dqkv = batch_shard_map(run, n_batched=5, head_dims=(3, None, 2, 1, 2, None, None), out_head_dim=3)(
        qkv, code, out, lse, do, seed, offsets)
    return dqkv, None, None, None''','''@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7, 8))
def _flash_qkv(qkv, bias, code, seed, offsets, rate, interpret, blocks, heads):
    return _flash_qkv_fwd(qkv, bias, code, seed, offsets, rate, interpret, blocks, heads)[0]


def _flash_qkv_fwd(qkv, bias, code, seed, offsets, rate, interpret, blocks, heads):
    def run(row, head, qkv, code, bias, seed, offsets):
        return kernel.forward(qkv, qkv, qkv, code, _words(seed, offsets, row, head), rate=rate, blocks=blocks,
                              interpret=interpret, heads=heads, packed=True, bias=bias)
    out, lse = batch_shard_map(run, n_batched=2, head_dims=(3, None, 1, None, None), out_head_dim=(2, 1))(
        qkv, code, bias, seed, offsets)
    return out, (qkv, bias, code, seed, offsets, out, lse)


def _flash_qkv_bwd(rate, interpret, blocks, heads, res, do):
    qkv, bias, code, seed, offsets, out, lse = res

    def run(row, head, qkv, code, out, lse, do, bias, seed, offsets):
        return kernel.backward(qkv, qkv, qkv, code, _words(seed, offsets, row, head), out, lse, do, rate=rate,
                               blocks=blocks, interpret=interpret, heads=heads, packed=True, bias=bias)
    dqkv = batch_shard_map(run, n_batched=5, head_dims=(3, None, 2, 1, 2, 1, None, None), out_head_dim=3)(
        qkv, code, out, lse, do, bias, seed, offsets)
    dbias = None if bias is None else jnp.sum(dqkv, axis=(0, 1), dtype=jnp.float32).astype(bias.dtype)
    return dqkv, dbias, None, None, None'''),
])
edit('layouts/layer.py',[
('''    qkv = einsum(L.qkv, x, annotate(kernel.astype(dt), "CDNH"))
    return''','''    qkv = einsum(L.qkv, x, annotate(kernel.astype(dt), "CDNH"))
    if bias is None:
        return qkv
    return'''),
('''def attention(f, pallas: bool, qkv: Annotated, mask, L: LayoutConfig, *, seed, rate: float) -> Annotated:''','''def attention(f, pallas: bool, qkv: Annotated, mask, L: LayoutConfig, *, seed, rate: float, bias=None) -> Annotated:'''),
('''        ctx = f.attention_qkv(relayout(qkv, FLASH_QKV).array, mask, seed=seed, rate=rate)''','''        ctx = f.attention_qkv(relayout(qkv, FLASH_QKV).array, mask, bias=bias, seed=seed, rate=rate)'''),
])
edit('jaxformer/model.py',[
('''        qkv = constrain(layer_ops.qkv_projection(x, self.qkv_kernel[...], self.qkv_bias[...], L, dt))  # N: tensor
        rate = 0.0 if deterministic else cfg.attention_probs_dropout_prob
        ctx = layer_ops.attention(f, pallas, qkv, mask, L, seed=seeds[0], rate=rate)  # BSNH''','''        bias = self.qkv_bias[...]
        qkv = constrain(layer_ops.qkv_projection(x, self.qkv_kernel[...], None if pallas else bias, L, dt))
        rate = 0.0 if deterministic else cfg.attention_probs_dropout_prob
        ctx = layer_ops.attention(f, pallas, qkv, mask, L, seed=seeds[0], rate=rate, bias=bias if pallas else None)'''),
])
