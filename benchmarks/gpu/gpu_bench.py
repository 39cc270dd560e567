"""GPU side-by-side: one BERT-MLM training step (forward, backward, AdamW), same shape, same FLOP model.

For a GPU machine with PyTorch, transformers and JAX but no TensorFlow: HF BertForMaskedLM
on torch (eager, torch.compile), KerasHub BertMaskedLM on Keras 3 + JAX, and trainformer's own model code
(src/trainformer/model) on Keras 3 + JAX with a jitted stateless step. JAX and TF's jit_compile share the
XLA compiler, so the model graph's efficiency shows here even though TF cannot run there.
PARTs: peak | hf-eager | hf-compile | kerashub[-nodrop] | tfm[-dpa|-dpafull|-bf16head|-fast|-nodrop|-donate]
  dpa: attention through keras.ops.dot_product_attention (mask (b,1,1,s)); dpafull: mask broadcast to
  (b,1,s,s) (cuDNN's fused kernel refuses the short one); bf16head: MLM logits in bf16 then cast;
  fast: dpafull + bf16head; nodrop: dropout 0; donate: donate the state buffers to the jitted step.
Usage: python gpu_bench.py PART [--batch 256 --seq 128 --layers 12 --hidden 768 ... --peak TFLOPS]
Prints one JSON line per result (tokens/s, step ms, model TFLOP/s, MFU vs the measured and the 989 peak).
"""
import argparse, json, os, sys, time

p = argparse.ArgumentParser()
p.add_argument("part")
p.add_argument("--batch", type=int, default=256)
p.add_argument("--seq", type=int, default=128)
p.add_argument("--steps", type=int, default=20)
p.add_argument("--warmup", type=int, default=4)
p.add_argument("--layers", type=int, default=12)
p.add_argument("--hidden", type=int, default=768)
p.add_argument("--heads", type=int, default=12)
p.add_argument("--inter", type=int, default=3072)
p.add_argument("--vocab", type=int, default=21128)
p.add_argument("--peak", type=float, default=0.0, help="measured bf16 TFLOP/s")
a = p.parse_args()
MASK = 0.15
P = int(round(MASK * a.seq))


def flops(batch=None, seq=None):
    b, s = batch or a.batch, seq or a.seq
    h, L, I, V = a.hidden, a.layers, a.inter, a.vocab
    tok = b * s
    enc = tok * L * (2 * (4 * h * h + 2 * h * I) + 4 * s * h)
    head = MASK * tok * 2 * (h * h + h * V)
    return 3 * (enc + head)


def emit(name, times, extra=None):
    times = sorted(times)
    med = times[len(times) // 2]
    tok = a.batch * a.seq / med
    tf = flops() / med / 1e12
    r = dict(peer=name, batch=a.batch, seq=a.seq, layers=a.layers, hidden=a.hidden, step_ms=round(med * 1e3, 2),
             tokens_per_s=round(tok), seq_per_s=round(a.batch / med, 1), model_tflops=round(tf, 1),
             mfu_vs_measured=round(tf / a.peak, 3) if a.peak else None, mfu_vs_989=round(tf / 989, 3))
    if extra: r.update(extra)
    print(json.dumps(r), flush=True)


def ids(rng_seed=0):
    import numpy as np
    rng = np.random.default_rng(rng_seed)
    return rng.integers(min(1000, a.vocab // 2), a.vocab, size=(a.batch, a.seq), dtype=np.int32)


if a.part == "peak":
    import torch
    x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16); y = torch.randn_like(x)
    for _ in range(3): x @ y
    torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(10): x @ y
    torch.cuda.synchronize(); dt = (time.perf_counter() - t) / 10
    print(json.dumps(dict(peer="peak-bf16-matmul-torch", tflops=round(2 * 8192**3 / dt / 1e12, 1),
                          gpu=torch.cuda.get_device_name())), flush=True)

elif a.part.startswith("hf"):
    import torch
    from transformers import BertConfig, BertForMaskedLM
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=a.vocab, hidden_size=a.hidden, num_hidden_layers=a.layers,
                     num_attention_heads=a.heads, intermediate_size=a.inter, max_position_embeddings=512)
    model = BertForMaskedLM(cfg).cuda().train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    fwd = torch.compile(model) if a.part == "hf-compile" else model
    x = torch.tensor(ids(), device="cuda")
    x = x.long(); labels = torch.full_like(x, -100)
    g = torch.Generator(device="cpu").manual_seed(1)
    pos = torch.stack([torch.randperm(a.seq, generator=g)[:P] for _ in range(a.batch)]).cuda()
    labels.scatter_(1, pos, x.gather(1, pos))
    inp = x.scatter(1, pos, 103)
    am = torch.ones_like(x)

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = fwd(input_ids=inp, attention_mask=am, labels=labels).loss
        loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
        return loss

    t0 = time.perf_counter()
    for _ in range(a.warmup): step()
    torch.cuda.synchronize(); warm = time.perf_counter() - t0
    times = []
    for _ in range(a.steps):
        t = time.perf_counter(); step(); torch.cuda.synchronize(); times.append(time.perf_counter() - t)
    emit(f"hf-torch-BertForMaskedLM-{a.part}-amp-bf16", times,
         dict(warmup_s=round(warm, 1), torch=torch.__version__, mem_gb=round(torch.cuda.max_memory_allocated() / 2**30, 1)))

elif a.part.startswith("tfm"):  # the project's own Keras 3 model on JAX
    os.environ["KERAS_BACKEND"] = "jax"
    import jax, jax.numpy as jnp, keras, numpy as np
    from keras import ops
    sys.path.insert(0, os.environ.get("TRAINFORMER_SRC", "src"))  # the project's src/ (model code only)
    from trainformer.config import ModelConfig
    from trainformer.model import layers as L
    from trainformer.model.heads import build_masked_lm
    if "dpa" in a.part or "fast" in a.part:  # keras.ops.dot_product_attention (cuDNN flash on GPU)
        def _attention(self, x, padding_mask, training):
            b, s = ops.shape(x)[0], ops.shape(x)[1]
            q, k, v = self._heads(x)
            mask = None if padding_mask is None else ops.cast(padding_mask, "bool")[:, None, None, :]
            if mask is not None and ("full" in a.part or "fast" in a.part):
                mask = ops.broadcast_to(mask, (b, 1, s, s))
            ctx = ops.dot_product_attention(q, k, v, mask=mask)
            return self._attention_output(ops.reshape(ctx, (b, s, self.num_heads * self.head_dim)))
        L.TransformerEncoderBlock._attention = _attention
    if "bf16head" in a.part or "fast" in a.part:  # logits in the compute dtype, cast to fp32 after
        def rcall(self, inputs, reverse=False):
            if not reverse:
                return keras.layers.Embedding.call(self, inputs)
            return ops.cast(ops.matmul(inputs, ops.transpose(ops.cast(self.embeddings, inputs.dtype))), "float32")
        L.ReversibleEmbedding.call = rcall
    keras.utils.set_random_seed(0)
    mc = ModelConfig(d_model=a.hidden, num_layers=a.layers, num_heads=a.heads, dff=a.inter, dropout=0.0 if "nodrop" in a.part else 0.1,
                     norm="post", position="learned")
    model = build_masked_lm(mc, vocab_size=a.vocab, max_length=512, dtype="mixed_bfloat16")
    opt = keras.optimizers.AdamW(learning_rate=1e-4)
    opt.build(model.trainable_variables)
    x = ids()
    rng = np.random.default_rng(1)
    pos = np.stack([rng.permutation(a.seq)[:P] for _ in range(a.batch)]).astype(np.int32)
    y = np.take_along_axis(x, pos, 1)
    xin = x.copy(); np.put_along_axis(xin, pos, 103, 1)
    batch = {"token_ids": jnp.asarray(xin), "padding_mask": jnp.ones_like(jnp.asarray(xin), dtype=bool),
             "masked_positions": jnp.asarray(pos)}
    y = jnp.asarray(y)

    def loss_fn(tv, ntv, batch, y):
        logits, ntv = model.stateless_call(tv, ntv, batch, training=True)
        loss = ops.mean(keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True))
        return loss, ntv

    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

    @(jax.jit if "donate" not in a.part else (lambda f: jax.jit(f, donate_argnums=0)))
    def train_step(state, batch, y):
        tv, ntv, ov = state
        (loss, ntv), grads = grad_fn(tv, ntv, batch, y)
        tv, ov = opt.stateless_apply(ov, grads, tv)
        return loss, (tv, ntv, ov)

    state = ([v.value for v in model.trainable_variables], [v.value for v in model.non_trainable_variables],
             [v.value for v in opt.variables])
    t0 = time.perf_counter()
    for _ in range(a.warmup):
        loss, state = train_step(state, batch, y)
    loss.block_until_ready(); warm = time.perf_counter() - t0
    times = []
    for _ in range(a.steps):
        t = time.perf_counter(); loss, state = train_step(state, batch, y); loss.block_until_ready()
        times.append(time.perf_counter() - t)
    emit(f"trainformer-model-keras-jax-{a.part}-mixed-bf16", times,
         dict(warmup_s=round(warm, 1), loss=float(loss), jax=jax.__version__, params=model.count_params(),
              src=os.environ.get("TRAINFORMER_SRC", "src")))

elif a.part.startswith("kerashub"):
    os.environ["KERAS_BACKEND"] = "jax"
    import keras, keras_hub, numpy as np
    keras.config.set_dtype_policy("mixed_bfloat16")
    keras.utils.set_random_seed(0)
    backbone = keras_hub.models.BertBackbone(vocabulary_size=a.vocab, num_layers=a.layers, num_heads=a.heads,
                                             hidden_dim=a.hidden, intermediate_dim=a.inter, max_sequence_length=512,
                                             dropout=0.0 if "nodrop" in a.part else 0.1)
    mlm = keras_hub.models.BertMaskedLM(backbone=backbone, preprocessor=None)
    mlm.compile(optimizer=keras.optimizers.AdamW(1e-4),
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), jit_compile=True)
    x = ids(); rng = np.random.default_rng(1)
    pos = np.stack([rng.permutation(a.seq)[:P] for _ in range(a.batch)]).astype(np.int32)
    y = np.take_along_axis(x, pos, 1); xin = x.copy(); np.put_along_axis(xin, pos, 103, 1)
    feats = {"token_ids": xin, "padding_mask": np.ones_like(xin, dtype=bool),
             "segment_ids": np.zeros_like(xin), "mask_positions": pos}
    t0 = time.perf_counter()
    for _ in range(a.warmup): m = mlm.train_on_batch(feats, y, return_dict=True)
    warm = time.perf_counter() - t0
    times = []
    for _ in range(a.steps):
        t = time.perf_counter(); m = mlm.train_on_batch(feats, y, return_dict=True); times.append(time.perf_counter() - t)
    emit("kerashub-BertMaskedLM-jax-mixed-bf16-train_on_batch", times,
         dict(warmup_s=round(warm, 1), loss=float(m["loss"]), keras_hub=keras_hub.__version__))
