"""Attention heatmaps: the maps are the block's own softmax, the picture shows them, the font
choice falls back to ids without a CJK font."""

import io

import keras
import numpy as np
import pytest
import tensorflow as tf
from PIL import Image, ImageFont

from trainformer.config import ConfigError, ModelConfig, load_config
from trainformer.data.pipeline import pack, tokenize_documents
from trainformer.tokens import CLS_ID, PAD_ID, SEP_ID
from trainformer.model.heads import build_masked_lm
from trainformer.model.layers import TransformerEncoderBlock, gelu
from trainformer.run.attention import AttentionSnapshot, sentence_from_windows
from trainformer.images import VIRIDIS, choose_labels, colorize, find_cjk_font, has_glyphs, plain_font, render_heatmaps
from trainformer.train.monitor import Monitor

SEQ_LEN = 64


@pytest.fixture(scope="module")
def windows(corpus, tokenizer):
    return pack(tokenize_documents(tokenizer, corpus.valid[:40]), SEQ_LEN)


def tiny_model(vocab_size, norm="post", num_heads=2, dtype=None):
    keras.utils.set_random_seed(0)
    config = ModelConfig(d_model=32, num_layers=3, num_heads=num_heads, dff=64, dropout=0.1, norm=norm)
    return build_masked_lm(config, vocab_size, SEQ_LEN, dtype=dtype)


@pytest.fixture(scope="module")
def model(tokenizer):
    return tiny_model(tokenizer.vocab_size)


def padded(ids, extra=4):
    """The sentence followed by `extra` [PAD]s, with its padding mask."""
    ids = np.concatenate([ids, np.full((1, extra), PAD_ID, np.int32)], axis=1)
    return ids, ids != PAD_ID


def test_sentence_is_the_first_window_up_to_its_first_sep(windows):
    ids, mask = sentence_from_windows(windows, max_tokens=32)
    assert ids.dtype == np.int32 and ids.shape == mask.shape and mask.all()
    first = windows[0][:32]
    assert ids[0, 0] == CLS_ID
    if SEP_ID in first:
        end = int(np.flatnonzero(first == SEP_ID)[0])
        np.testing.assert_array_equal(ids[0], first[: end + 1])
    else:
        np.testing.assert_array_equal(ids[0], first)
    short, _ = sentence_from_windows(np.array([[CLS_ID, 7, 8, 9, 10, 11]]), max_tokens=4)
    np.testing.assert_array_equal(short, [[CLS_ID, 7, 8, 9]])
    cut, _ = sentence_from_windows(np.array([[CLS_ID, 7, SEP_ID, 9, PAD_ID]]), max_tokens=32)
    np.testing.assert_array_equal(cut, [[CLS_ID, 7, SEP_ID]])
    unpadded, _ = sentence_from_windows(np.array([[CLS_ID, 7, 8, PAD_ID, PAD_ID]]), max_tokens=32)
    np.testing.assert_array_equal(unpadded, [[CLS_ID, 7, 8]])


@pytest.mark.parametrize("layer", [0, -1])
def test_each_head_is_a_distribution_over_the_real_keys(model, windows, tokenizer, layer):
    ids, mask = padded(sentence_from_windows(windows)[0])
    probs = AttentionSnapshot(model, tokenizer, ids, mask, layer=layer, font=None).probabilities()
    length = ids.shape[1]
    assert probs.shape == (2, length, length) and probs.dtype == np.float32
    np.testing.assert_allclose(probs.sum(-1), 1.0, atol=1e-5)
    assert probs[:, :, ~mask[0]].max() < 1e-6  # padded keys get nothing
    assert probs[:, :, mask[0]].min() > 0.0


def test_layer_counts_from_the_end_and_is_checked(model, tokenizer):
    ids = np.array([[CLS_ID, 10, 11, SEP_ID]], np.int32)
    assert AttentionSnapshot(model, tokenizer, ids, layer=-1, font=None).layer == 2
    assert AttentionSnapshot(model, tokenizer, ids, layer=-3, font=None).block.name == "block_0"
    for bad in (3, -4):
        with pytest.raises(ValueError, match="out of range for 3 encoder layers"):
            AttentionSnapshot(model, tokenizer, ids, layer=bad)


def test_the_probe_feeds_the_block_its_real_input(model, windows, tokenizer):
    """Block i applied to the probed input of block i gives the probed input of block i+1, and
    the last block gives the encoder's output: the maps are drawn from the real activations."""
    ids, mask = padded(sentence_from_windows(windows)[0])
    inputs = {"token_ids": ids, "padding_mask": mask}
    snapshots = [AttentionSnapshot(model, tokenizer, ids, mask, layer=i, font=None) for i in range(3)]
    hidden = [np.asarray(s._probe(inputs, training=False)) for s in snapshots]
    outputs = [np.asarray(s.block(h, padding_mask=mask, training=False)) for s, h in zip(snapshots, hidden)]
    np.testing.assert_allclose(outputs[0], hidden[1], atol=1e-5)
    np.testing.assert_allclose(outputs[1], hidden[2], atol=1e-5)
    np.testing.assert_allclose(outputs[2], np.asarray(model.encoder(inputs, training=False)), atol=1e-5)


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_probabilities_are_the_softmax_call_attends_with(norm):
    """By hand: softmax(q k^T / sqrt(d_head)) with padded keys removed; and the block's output
    rebuilt from those probabilities equals `call`."""
    rng = np.random.default_rng(1)
    block = TransformerEncoderBlock(num_heads=4, dff=64, dropout=0.0, norm=norm)
    x = rng.normal(size=(2, 9, 32)).astype("float32")
    mask = np.ones((2, 9), bool)
    mask[1, 6:] = False
    expected_output = np.asarray(block(x, padding_mask=mask, training=False))
    probs = np.asarray(block.attention_probabilities(x, padding_mask=mask))
    assert probs.shape == (2, 4, 9, 9) and probs.dtype == np.float32

    h = np.asarray(block._attention_norm(x)) if norm == "pre" else x
    kernel, bias = (np.asarray(w) for w in block._qkv.weights)
    q, k, v = np.split((h @ kernel + bias).reshape(2, 9, 3, 4, 8), 3, axis=2)  # (b, s, 1, heads, 8)
    q, k, v = (t[:, :, 0].transpose(0, 2, 1, 3) for t in (q, k, v))  # (b, heads, s, 8)
    scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(8.0)
    scores = np.where(mask[:, None, None, :], scores, -np.inf)
    by_hand = np.exp(scores - scores.max(-1, keepdims=True))
    by_hand /= by_hand.sum(-1, keepdims=True)
    np.testing.assert_allclose(probs, by_hand, atol=1e-5)

    context = (probs @ v).transpose(0, 2, 1, 3).reshape(2, 9, 32)
    attended = block._attention_output(context)
    ffn = lambda t: block._ffn_output(gelu(block._ffn_inner(t)))  # noqa: E731 (the block's default activation)
    if norm == "pre":
        y = x + attended
        y = y + ffn(block._ffn_norm(y))
    else:
        y = block._attention_norm(x + attended)
        y = block._ffn_norm(y + ffn(y))
    np.testing.assert_allclose(np.asarray(y), expected_output, atol=1e-4)


def test_probabilities_are_float32_under_mixed_precision(tokenizer):
    model = tiny_model(tokenizer.vocab_size, norm="pre", dtype="mixed_bfloat16")
    ids = np.array([[CLS_ID, 10, 11, 12, SEP_ID]], np.int32)
    probs = AttentionSnapshot(model, tokenizer, ids, layer=-1, font=None).probabilities()
    assert probs.dtype == np.float32
    np.testing.assert_allclose(probs.sum(-1), 1.0, atol=1e-5)


def test_image_is_a_grid_of_heatmaps_with_labels(tokenizer, windows):
    model = tiny_model(tokenizer.vocab_size, num_heads=4)
    ids, mask = padded(sentence_from_windows(windows)[0])
    snapshot = AttentionSnapshot(model, tokenizer, ids, mask, layer=-1, font=None)
    image = snapshot.image()
    assert image.dtype == np.uint8 and image.ndim == 4 and image.shape[0] == 1 and image.shape[-1] == 3
    pixels = image[0].reshape(-1, 3)
    length = int(mask.sum())  # padding is left out of the picture
    cell = int(np.clip(480 // length, 12, 20))
    # 4 heads -> 2 x 2 panels, each at least length x cell pixels square
    assert image.shape[1] > 2 * length * cell and image.shape[2] > 2 * length * cell
    colours = {tuple(p) for p in pixels}
    assert len(colours) > 50  # not blank: many shades
    assert tuple(VIRIDIS[-1].astype(np.uint8)) in colours  # each head's maximum is drawn in yellow
    assert (pixels.sum(-1) < 60).sum() > 500  # black label and title text


def test_each_cell_is_coloured_by_its_probability():
    """Head 0 attends to itself (a yellow diagonal on purple), head 1 uniformly (all yellow
    once scaled to its max): count the cells' pixels in the picture."""
    length, cell = 5, 12
    probs = np.stack([np.eye(length), np.full((length, length), 1 / length)]).astype("float32")
    labels = [str(i) for i in range(length)]
    image = render_heatmaps(probs, labels, plain_font(cell - 2), "test", cell)
    pixels = image.reshape(-1, 3)
    count = lambda colour: int((pixels == colour.astype(np.uint8)).all(-1).sum())  # noqa: E731
    assert count(VIRIDIS[-1]) == (length + length * length) * cell * cell
    assert count(VIRIDIS[0]) == (length * length - length) * cell * cell
    np.testing.assert_array_equal(colorize(np.array([0.0, 0.5, 1.0])), VIRIDIS[[0, 4, 8]].astype(np.uint8))


def test_labels_are_ids_without_a_cjk_font(tokenizer):
    ids = tokenizer(tf.constant(["人民日报"])).to_list()[0]
    font, labels = choose_labels(ids, tokenizer.vocab, None)
    assert labels == [str(i) for i in ids]
    assert isinstance(font, ImageFont.FreeTypeFont)
    assert not has_glyphs(plain_font(14), "中")  # DejaVu / Pillow's font cannot draw Chinese...
    assert has_glyphs(plain_font(14), "123")
    # ...so naming a font without CJK glyphs also gives ids
    assert choose_labels(ids, tokenizer.vocab, plain_font(14).path)[1] == [str(i) for i in ids]
    assert choose_labels(ids, tokenizer.vocab, "/no/such/font.ttf")[1] == [str(i) for i in ids]


def test_labels_are_token_text_with_a_cjk_font(tokenizer):
    path = find_cjk_font()
    if path is None:
        pytest.skip("no font with CJK glyphs installed (e.g. apt install fonts-noto-cjk or fonts-wqy-microhei)")
    ids = tokenizer(tf.constant(["人民日报"])).to_list()[0]
    _, labels = choose_labels(ids, tokenizer.vocab, path)
    assert labels == tokenizer.detokenize(ids) and "人" in labels


def test_monitor_writes_the_image_to_the_valid_log(tmp_path, model, tokenizer):
    ids = np.array([[CLS_ID, 10, 11, 12, SEP_ID]], np.int32)
    snapshot = AttentionSnapshot(model, tokenizer, ids, layer=-1, font=None)
    monitor = Monitor(tmp_path / "metrics.jsonl", tmp_path / "logs", total_steps=10, items_per_step=1)
    snapshot.log(monitor, step=7)
    monitor.close()
    found = []
    for event_file in (tmp_path / "logs" / "valid").iterdir():
        for event in tf.compat.v1.train.summary_iterator(str(event_file)):
            for value in event.summary.value:
                found.append((event.step, value.tag, value.tensor.string_val))
    assert [(step, tag) for step, tag, _ in found] == [(7, "attention/layer_2")]
    width, height, png = found[0][2]
    decoded = np.asarray(Image.open(io.BytesIO(png)))
    np.testing.assert_array_equal(decoded, snapshot.image()[0])
    assert (int(width), int(height)) == (decoded.shape[1], decoded.shape[0])


def test_config_checks_attention_layer_against_the_model():
    assert load_config(None).train.attention_layer == -1
    layers = load_config(None).model.num_layers
    assert load_config(None, [f"train.attention_layer={-layers}"]).train.attention_layer == -layers
    with pytest.raises(ConfigError, match=rf"train.attention_layer: must be within \[-{layers}, {layers - 1}\]"):
        load_config(None, [f"train.attention_layer={layers}"])
