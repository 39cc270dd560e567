"""Greedy and beam search, in the graph: a tf.while_loop over static shapes (XLA-compilable),
batched and deterministic. The decoder a served model runs is this one, not a Python loop.

Both searches drive a `step(tokens, index, state) -> (logits, state)` function:
- tokens (n, max_length + 1) int32: every sequence so far, [CLS] at position 0;
- index: the position whose token is new; logits (n, vocab) float32 score position index + 1;
- state: any nest of tensors with n rows first (a beam search reorders them with its beams).
`cached_step` (one position per token, through the decoder's key/value cache) and
`uncached_step` (the whole prefix again, the reference the cache must equal) make one.

Written in TensorFlow, unlike the backend-neutral model/: it runs inside the exported
SavedModel.
"""

from __future__ import annotations

import tensorflow as tf

from trainformer.tokens import CLS_ID, SEP_ID

NEG_INF = -1e9  # a score no hypothesis reaches: log-probabilities of max_length tokens stay far above it


def cached_step(model):
    """A step through model.decoder's cache: state = decoder.start(...)."""
    def step(tokens, index, state):
        return model.decoder.step(tokens[:, index], index, state)
    return step


def uncached_step(model):
    """A step that runs the decoder on the whole buffer (causal, so later positions do not
    matter) and reads position index: state = {"memory", "memory_mask", "source_ids"}."""
    def step(tokens, index, state):
        # Positions 0..max_length-1 are inputs; the last one only ever holds an output.
        logits = model.decoder(tokens[:, :-1], state["memory"], state["memory_mask"], state["source_ids"],
                               training=False)
        return logits[:, index, :], state
    return step


def initial_state(model, source_ids, source_mask, max_length: int, cache: bool = True):
    """Encode the sources once; the decoding state of `cached_step` or `uncached_step`."""
    memory = model.encode(source_ids, source_mask)
    if cache:
        return model.decoder.start(memory, source_mask, max_length + 1, source_ids)
    return {"memory": memory, "memory_mask": source_mask, "source_ids": source_ids}


def _while(going, body, loop_vars):
    """tf.while_loop whose body keeps the static shapes its variables entered with: ops in a
    body can lose a batch size the graph knew (a constant-folded tf.shape), which the loop
    refuses."""
    def same_shapes(*variables):
        updated = body(*variables)
        for new, old in zip(tf.nest.flatten(updated), tf.nest.flatten(variables)):
            new.set_shape(old.shape)
        return updated

    return tf.while_loop(going, same_shapes, loop_vars)


def _with_token(tokens, position, new):
    """tokens (n, L) with column `position` set to new (n,): one-hot arithmetic, XLA-friendly."""
    column = tf.one_hot(position, tf.shape(tokens)[1], dtype=tokens.dtype)  # (L,)
    return tokens * (1 - column)[None, :] + new[:, None] * column[None, :]


def greedy_search(step, state, batch, max_length: int):
    """The most likely next token at every position until [SEP] or max_length tokens.

    Returns (tokens (batch, max_length) int32, padded with 0 after [SEP], [CLS] not included;
    log-probabilities (batch,) float32 of the output, [SEP] included)."""
    tokens = tf.fill([batch, max_length + 1], 0)
    tokens = _with_token(tokens, 0, tf.fill([batch], CLS_ID))

    def body(index, tokens, log_probs, done, state):
        logits, state = step(tokens, index, state)
        step_log_probs = tf.nn.log_softmax(logits)  # (batch, vocab)
        chosen = tf.argmax(step_log_probs, axis=-1, output_type=tf.int32)
        log_probs += tf.where(done, 0.0, tf.gather(step_log_probs, chosen, batch_dims=1))
        chosen = tf.where(done, 0, chosen)
        return index + 1, _with_token(tokens, index + 1, chosen), log_probs, done | (chosen == SEP_ID), state

    def going(index, tokens, log_probs, done, state):
        return (index < max_length) & ~tf.reduce_all(done)

    _, tokens, log_probs, _, _ = _while(
        going, body, (tf.constant(0), tokens, tf.zeros([batch]), tf.zeros([batch], tf.bool), state))
    return tokens[:, 1:], log_probs


def length_penalty(length, alpha: float):
    """GNMT's ((5 + length) / 6) ** alpha: a hypothesis' score is its log-probability divided by it."""
    return tf.pow((5.0 + tf.cast(length, tf.float32)) / 6.0, alpha)


def _gather_beams(nest, beam_indices, batch, beam_size):
    """Rows of a (batch * beam_size, ...) nest reordered by beam_indices (batch, k): row j of
    item b becomes its former beam beam_indices[b, j]."""
    flat = tf.reshape(beam_indices + tf.range(batch)[:, None] * beam_size, [-1])
    return tf.nest.map_structure(lambda tensor: tf.gather(tensor, flat), nest)


def beam_search(step, state, batch, max_length: int, beam_size: int, alpha: float):
    """Beam search with GNMT's length penalty (Wu et al. 2016, as tensor2tensor runs it).

    Each step extends every live hypothesis by every token, keeps the 2k best extensions: those
    ending in [SEP] join the finished list (scored with the length penalty; the list keeps its k
    best), the k best others stay live. At max_length the live ones are finished as they are.
    It stops early once no live hypothesis can beat the k-th finished one (log-probabilities
    only fall, and with alpha >= 0 the penalty is largest at max_length).

    state has `batch` rows; it is repeated per beam here. Returns (tokens (batch, k, max_length)
    int32 without [CLS], 0 after [SEP]; scores (batch, k) float32, best first; dropped (batch,):
    the best score of any finished hypothesis that was dropped, NEG_INF if none — never above
    the k-th returned score).
    """
    k, width = beam_size, max_length + 1
    state = tf.nest.map_structure(lambda tensor: tf.repeat(tensor, k, axis=0), state)  # (batch * k, ...)
    alive = _with_token(tf.zeros([batch * k, width], tf.int32), 0, tf.fill([batch * k], CLS_ID))
    alive = tf.reshape(alive, [batch, k, width])
    alive_log_probs = tf.tile(tf.constant([[0.0] + [NEG_INF] * (k - 1)]), [batch, 1])  # one live beam at first
    finished = tf.zeros_like(alive)
    finished_scores = tf.fill([batch, k], NEG_INF)
    dropped = tf.fill([batch], NEG_INF)

    def body(index, alive, alive_log_probs, finished, finished_scores, dropped, state):
        logits, state = step(tf.reshape(alive, [batch * k, width]), index, state)
        vocab = tf.shape(logits)[-1]
        log_probs = tf.reshape(tf.nn.log_softmax(logits), [batch, k, vocab]) + alive_log_probs[:, :, None]
        top_log_probs, top = tf.math.top_k(tf.reshape(log_probs, [batch, -1]), 2 * k)  # (batch, 2k)
        beams, tokens = top // vocab, top % vocab
        candidates = tf.gather(alive, beams, batch_dims=1)  # (batch, 2k, L)
        candidates = tf.reshape(_with_token(tf.reshape(candidates, [batch * 2 * k, width]), index + 1,
                                            tf.reshape(tokens, [-1])), [batch, 2 * k, width])
        ends = tokens == SEP_ID
        last = index + 1 == max_length

        # The k best extensions that did not end stay live (their state follows their beam).
        live_log_probs, live = tf.math.top_k(tf.where(ends, NEG_INF, top_log_probs), k)
        alive = tf.gather(candidates, live, batch_dims=1)
        state = _gather_beams(state, tf.gather(beams, live, batch_dims=1), batch, k)

        # Finished: those that ended, and at the last position every one; the list keeps its k best.
        scores = tf.where(ends | last, top_log_probs / length_penalty(index + 1, alpha), NEG_INF)
        pool_scores = tf.concat([finished_scores, scores], axis=1)  # (batch, 3k)
        pool = tf.concat([finished, candidates], axis=1)
        finished_scores, kept = tf.math.top_k(pool_scores, k)
        finished = tf.gather(pool, kept, batch_dims=1)
        left_out = tf.reduce_sum(tf.one_hot(kept, 3 * k), axis=1) == 0  # (batch, 3k)
        dropped = tf.maximum(dropped, tf.reduce_max(tf.where(left_out, pool_scores, NEG_INF), axis=1))
        return index + 1, alive, live_log_probs, finished, finished_scores, dropped, state

    def going(index, alive, alive_log_probs, finished, finished_scores, dropped, state):
        best_possible = alive_log_probs[:, 0] / length_penalty(max_length, alpha)  # (batch,)
        return (index < max_length) & tf.reduce_any(best_possible > finished_scores[:, -1])

    loop = (tf.constant(0), alive, alive_log_probs, finished, finished_scores, dropped, state)
    _, _, _, finished, finished_scores, dropped, _ = _while(going, body, loop)
    return finished[:, :, 1:], finished_scores, dropped  # positions past [SEP] were never written: 0
