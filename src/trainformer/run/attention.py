"""Attention heatmaps for TensorBoard: every head of one encoder layer on a fixed sentence.

At each eval the run draws the attention weights the model computes for one short valid
sentence: one panel per head, queries down the rows, keys across the columns, the tokens on
both axes. Tokens are written as text when a font with CJK glyphs is installed (the corpora
here are Chinese; DejaVu and Pillow's built-in font would draw empty boxes), else as ids.

Example:
    snapshot = AttentionSnapshot(model, tokenizer.vocab, *sentence_from_windows(data.valid_windows),
                                 layer=config.train.attention_layer)
    snapshot.log(monitor, step)  # writes attention/layer_3 to logs/valid
"""

from __future__ import annotations

import keras
import numpy as np

from trainformer.images import choose_labels, find_cjk_font, render_heatmaps
from trainformer.model.layers import TransformerEncoderBlock
from trainformer.tokens import PAD_ID, SEP_ID


def sentence_from_windows(windows: np.ndarray, max_tokens: int = 32) -> tuple[np.ndarray, np.ndarray]:
    """A short fixed sentence to draw: the first window's tokens up to and including its first
    [SEP], at most max_tokens, padding dropped. Returns token_ids (1, T) int32 and
    padding_mask (1, T) bool."""
    window = np.asarray(windows[0])[:max_tokens]
    window = window[window != PAD_ID]
    sep = np.flatnonzero(window == SEP_ID)
    if sep.size:
        window = window[: sep[0] + 1]
    ids = window.astype(np.int32)[None]
    return ids, np.ones_like(ids, bool)


class AttentionSnapshot:
    """Every head's attention map of one encoder layer for one fixed sentence.

    A probe model on the encoder's functional graph computes the chosen block's input; the
    block's own `attention_probabilities` (the code its `call` runs) turns that into the maps.
    The probe shares the model's weights, so each call sees the current training state.

    Args:
        model: a MaskedLM (anything with an `.encoder`) or a TransformerEncoder.
        vocab: the tokenizer's vocabulary (token id -> text), or an object with `.vocab`
            (a Tokenizer); None labels the axes with ids.
        token_ids: (1, T) int32, one sentence.
        padding_mask: (1, T) bool, False at padding; None: no padding. Padded positions are
            left out of the picture.
        layer: which block; negative counts from the end (-1: the last).
        font: a font file for token labels; "auto" searches for a CJK font, None uses ids.

    Example:
        snapshot = AttentionSnapshot(model, tokenizer, ids, mask, layer=-1)
        probs = snapshot.probabilities()  # (heads, T, T) float32
        snapshot.log(monitor, step)
    """

    def __init__(self, model, vocab, token_ids, padding_mask=None, layer: int = -1, font: str | None = "auto"):
        encoder = getattr(model, "encoder", model)
        blocks = [item for item in encoder.layers if isinstance(item, TransformerEncoderBlock)]
        if not -len(blocks) <= layer < len(blocks):
            raise ValueError(f"attention layer {layer} is out of range for {len(blocks)} encoder layers")
        self.layer = layer % len(blocks)
        self.num_layers = len(blocks)
        self.block = blocks[self.layer]
        # The block's first call argument is its input x (the second, padding_mask, is an input).
        block_input = keras.tree.flatten(self.block.input)[0]
        self._probe = keras.Model(encoder.input, block_input, name=f"attention_probe_{self.layer}")
        self.token_ids = np.asarray(token_ids, np.int32).reshape(1, -1)
        mask = np.ones_like(self.token_ids, bool) if padding_mask is None else np.asarray(padding_mask, bool)
        self.padding_mask = mask.reshape(1, -1)
        self.vocab = getattr(vocab, "vocab", vocab)
        self.font = find_cjk_font() if font == "auto" else font

    @property
    def name(self) -> str:
        return f"attention/layer_{self.layer}"

    def probabilities(self) -> np.ndarray:
        """(heads, T, T) float32: row q is how query token q spreads its attention over the keys."""
        inputs = {"token_ids": self.token_ids, "padding_mask": self.padding_mask}
        x = self._probe(inputs, training=False)  # (1, T, d): the block's input
        probs = self.block.attention_probabilities(x, padding_mask=self.padding_mask)
        return np.asarray(keras.ops.convert_to_numpy(probs))[0]

    def image(self) -> np.ndarray:
        """(1, H, W, 3) uint8, ready for tf.summary.image."""
        keep = self.padding_mask[0]
        probs = self.probabilities()[:, keep][:, :, keep]
        ids = self.token_ids[0, keep]
        cell = int(np.clip(480 // max(len(ids), 1), 12, 20))
        font, labels = choose_labels(ids, self.vocab, self.font, size=cell - 2)
        title = (f"layer {self.layer} (0-based, of {self.num_layers}), {len(ids)} tokens: rows = queries, "
                 f"columns = keys, colour 0 -> each head's max")
        return render_heatmaps(probs, labels, font, title, cell)[None]

    def log(self, monitor, step: int) -> None:
        monitor.log_image(step, self.name, self.image())
