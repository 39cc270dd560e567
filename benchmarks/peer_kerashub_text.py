"""Peer 1 on real text: KerasHub BertMaskedLM fed the way KerasHub's BertMaskedLMPreprocessor
feeds it: one document per example, [CLS] doc [SEP] truncated/padded to SEQ
(keras_hub.layers.StartEndPacker), masked by MaskedLMMaskGenerator (special and pad tokens
unselectable), in a tf.data pipeline (shuffle, batch, map, prefetch).

The documents are People's Daily paragraphs tokenized with the same vocabulary trainformer
trained (written by `peer_trainformer.py --text 1 --docs-out`), so both see the same text; the
difference is padding each document versus packing the stream. Effective tokens/s counts the
non-pad tokens of the timed batches.
"""
import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import common

args = common.parse_args(lambda p: p.add_argument("--docs", required=True, help="npz from peer_trainformer.py"))

import numpy as np
import tensorflow as tf

tf.config.threading.set_intra_op_parallelism_threads(args.threads)
tf.config.threading.set_inter_op_parallelism_threads(args.threads)

import keras
import keras_hub

keras.utils.set_random_seed(common.SEED)
cfg = dict(common.CONFIGS[args.config])
docs = np.load(args.docs)
cfg["vocab"] = vocab = int(docs["vocab_size"])
pad, cls, sep, mask = (int(docs[k]) for k in ("pad", "cls", "sep", "mask"))

backbone = keras_hub.models.BertBackbone(
    vocabulary_size=vocab, num_layers=cfg["layers"], num_heads=cfg["heads"],
    hidden_dim=cfg["hidden"], intermediate_dim=cfg["intermediate"],
    dropout=cfg["dropout"], max_sequence_length=cfg["max_pos"])
model = keras_hub.models.BertMaskedLM(backbone=backbone, preprocessor=None)
model.compile(optimizer=keras.optimizers.AdamW(learning_rate=common.LR),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
              weighted_metrics=[])
n_params = model.count_params()

packer = keras_hub.layers.StartEndPacker(sequence_length=common.SEQ, start_value=cls, end_value=sep,
                                         pad_value=pad, return_padding_mask=True)
masker = keras_hub.layers.MaskedLMMaskGenerator(
    vocabulary_size=vocab, mask_selection_rate=common.MASK_RATE, mask_token_id=mask,
    mask_selection_length=common.SEQ * 96 // 512, unselectable_token_ids=[pad, cls, sep])


def preprocess(ragged_ids):  # what BertMaskedLMPreprocessor does after tokenizing
    token_ids, padding_mask = packer(ragged_ids)
    m = masker(token_ids)
    x = {"token_ids": m["token_ids"], "segment_ids": tf.zeros_like(token_ids),
         "padding_mask": padding_mask, "mask_positions": m["mask_positions"]}
    return x, m["mask_ids"], m["mask_weights"]


documents = tf.RaggedTensor.from_row_lengths(docs["flat"], docs["lengths"])
dataset = (tf.data.Dataset.from_tensor_slices(documents).shuffle(len(docs["lengths"]), seed=common.SEED)
           .repeat().ragged_batch(common.BATCH).map(preprocess, num_parallel_calls=tf.data.AUTOTUNE)
           .prefetch(tf.data.AUTOTUNE))
batches = iter(dataset)
nonpad = []


def step(i):
    x, y, w = next(batches)  # fetch inside the timed step, as training does
    nonpad.append(int(tf.reduce_sum(tf.cast(x["padding_mask"], tf.int32))))
    model.train_on_batch(x, y, sample_weight=w)


timing = common.run_timed(step, args.warmup, args.steps)
common.emit(args, "kerashub-BertMaskedLM pad-to-length text", timing, params=n_params,
            threads=f"tf intra={args.threads} inter={args.threads}", mode="text",
            nonpad_tokens=sum(nonpad[args.warmup:]), flops=common.model_flops_per_step(cfg),
            notes=f"tf {tf.__version__} keras {keras.__version__} keras_hub {keras_hub.__version__}; "
                  f"vocab {vocab}; non-pad share {sum(nonpad) / (len(nonpad) * common.BATCH * common.SEQ):.3f}")
