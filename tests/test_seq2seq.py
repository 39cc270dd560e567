"""Seq2seq end to end through the real command line, on the real People's Daily headlines:
train, the eval outputs beside their references, eval --json, predict with the n-best. (A resume
is the engine's, task-agnostic: tests/train/test_resume.py and a fine-tune's in test_classify.py;
the token-budget stream's restart at any batch: tests/data/test_seq2seq_pipeline.py.)"""

import json
import shutil
import unicodedata
from collections import Counter

import keras
import numpy as np
import pytest
import sacrebleu
import tensorflow as tf
from cli_helpers import in_process, read_metrics, trainformer

from trainformer.config import load_config
from trainformer.model.heads import build_masked_lm
from trainformer.model.seq2seq import build_seq2seq
from trainformer.run.inference import load_run
from trainformer.tokens import SEP_ID
from trainformer.train.checkpoint import Checkpoints, restore_pretrained

def characters(text: str) -> list[str]:
    return [c for c in unicodedata.normalize("NFKC", text) if not c.isspace()]


def f_measure(overlap: int, predicted: int, expected: int) -> float:
    precision, recall = overlap / max(predicted, 1), overlap / max(expected, 1)
    return 2 * precision * recall / (precision + recall) if overlap else 0.0


def ngram_f(output: list[str], reference: list[str], n: int) -> float:
    ours, theirs = (Counter(zip(*(text[i:] for i in range(n)))) for text in (output, reference))
    return f_measure(sum((ours & theirs).values()), sum(ours.values()), sum(theirs.values()))


def lcs_f(output: list[str], reference: list[str]) -> float:
    above = [0] * (len(reference) + 1)
    for a in output:
        row = [0]
        for j, b in enumerate(reference, 1):
            row.append(above[j - 1] + 1 if a == b else max(above[j], row[j - 1]))
        above = row
    return f_measure(above[-1], len(output), len(reference))


def scores_of(rows: list[dict]) -> dict:
    """The scores of an eval outputs file, computed here: BLEU (zh tokens) and chrF by sacrebleu
    on NFKC text, ROUGE-1/2/L F-measures per character by hand, averaged over the rows."""
    outputs = [unicodedata.normalize("NFKC", row["output"]) for row in rows]
    references = [unicodedata.normalize("NFKC", row["reference"]) for row in rows]
    pairs = [(characters(row["output"]), characters(row["reference"])) for row in rows]
    return {"bleu": sacrebleu.corpus_bleu(outputs, [references], tokenize="zh").score,
            "chrf": sacrebleu.corpus_chrf(outputs, [references]).score,
            "rouge1": 100 * sum(ngram_f(o, r, 1) for o, r in pairs) / len(pairs),
            "rouge2": 100 * sum(ngram_f(o, r, 2) for o, r in pairs) / len(pairs),
            "rougeL": 100 * sum(lcs_f(o, r) for o, r in pairs) / len(pairs)}


def assert_scores_of(result: dict, rows: list[dict]) -> None:
    expected = scores_of(rows)
    assert {name: result[name] for name in expected} == pytest.approx(expected, rel=1e-9, abs=1e-9)


def test_training_writes_the_decoded_valid_split_beside_its_references(headline_run):
    run_dir, stdout = headline_run
    progress = [line for line in stdout.splitlines() if line.startswith("step ")]
    assert progress and all(" tok/s" in line and "data-wait" in line for line in progress)
    assert "BLEU" in stdout and "decode: strategy beam" in stdout
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["task"] == "seq2seq" and manifest["data"]["target_language"] == "zh"
    rows = [json.loads(line) for line in (run_dir / "eval" / "valid-20.jsonl").read_text().splitlines()]
    valid = [e for e in read_metrics(run_dir) if e.get("split") == "valid"][-1]
    assert len(rows) == valid["num_examples"] > 100
    assert all(set(row) == {"source", "reference", "output"} and row["reference"] for row in rows)
    assert_scores_of(valid, rows)  # the scores logged are those of the outputs written (0: see below)


def test_eval_json_scores_the_test_split(headline_run, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(headline_run[0], run_dir)  # eval writes its outputs into the run
    result = json.loads(in_process("eval", str(run_dir), "--split", "test", "--json").stdout)
    assert {"bleu", "chrf", "rouge1", "rouge2", "rougeL", "loss", "token_accuracy", "num_examples", "split", "step",
            "decode", "sentences_per_s"} <= set(result)
    assert result["split"] == "test" and result["step"] == 20 and result["num_examples"] > 100
    valid = json.loads(in_process("eval", str(run_dir), "--json").stdout)
    trained = [e for e in read_metrics(run_dir) if e.get("split") == "valid"][-1]
    assert valid["loss"] == pytest.approx(trained["loss"], abs=1e-4)  # the checkpoint holds the whole model
    assert result["decode"] == {"strategy": "beam", "max_length": 24, "beam_size": 2, "length_penalty": 0.6}
    rows = [json.loads(line) for line in (run_dir / "eval" / "test-20.jsonl").read_text().splitlines()]
    assert result["outputs_file"].endswith("test-20.jsonl") and len(rows) == result["num_examples"]
    assert_scores_of(result, rows)


def test_eval_scores_are_those_of_the_outputs_it_writes(headline_run, tmp_path):
    """20 steps teach the model to end at once (every output empty, every score 0). With [SEP]
    barred each output runs to 24 characters, some of them right: the scores eval computes are
    the ones computed here from the outputs file it writes."""
    run_dir, _ = headline_run
    shutil.copytree(run_dir, tmp_path / "run")  # save_outputs writes into the run
    task, model, _, step = load_run(tmp_path / "run")
    bias = model.decoder.output_bias.numpy()
    bias[SEP_ID] = -1e4
    model.decoder.output_bias.assign(bias)
    result = task.evaluator(model)("valid")
    rows = [json.loads(line) for line in task.save_outputs(step).read_text(encoding="utf-8").splitlines()]
    assert len(rows) == result["num_examples"] and all(row["output"] for row in rows)
    assert scores_of(rows)["chrf"] > 0 and scores_of(rows)["rouge1"] > 0  # nothing trivial to agree on
    assert_scores_of(result, rows)


def test_predict_prints_the_output_and_the_beams_n_best(headline_run):
    run_dir, _ = headline_run
    texts = ["新华社北京１月１日电 国家主席江泽民发表新年讲话。", "本报讯 今年粮食生产获得丰收。"]
    lines = in_process("predict", str(run_dir), *texts, "--nbest").stdout.splitlines()
    answers = [json.loads(line) for line in lines]
    assert [a["text"] for a in answers] == texts
    for answer in answers:
        assert len(answer["nbest"]) == 2 and answer["nbest"][0]["output"] == answer["output"]
        assert answer["nbest"][0]["score"] >= answer["nbest"][1]["score"] == pytest.approx(answer["nbest"][1]["score"])


def test_the_encoder_starts_from_a_pretraining_run(tmp_path):
    config = load_config(None, ["model.d_model=32", "model.num_layers=1", "model.num_heads=2", "model.dff=64"])
    keras.utils.set_random_seed(1)
    masked_lm = build_masked_lm(config.model, 100, 32)
    Checkpoints(tmp_path, 1, model=masked_lm, step=tf.Variable(0, dtype=tf.int64)).save(3)
    keras.utils.set_random_seed(2)
    model = build_seq2seq(config.model, 100, 32, 16)
    decoder_before = [w.numpy() for w in model.decoder.weights if "embedding" not in w.path]
    restore_pretrained(model, tmp_path)
    for ours, theirs in zip(model.encoder.weights, masked_lm.encoder.weights):
        np.testing.assert_array_equal(ours.numpy(), theirs.numpy())
    decoder_after = [w.numpy() for w in model.decoder.weights if "embedding" not in w.path]
    assert len(decoder_after) == len(decoder_before) > 10
    for before, after in zip(decoder_before, decoder_after):
        np.testing.assert_array_equal(before, after)


# The encoder weight each decoder weight starts from with model.decoder_init=encoder (BERT2BERT):
# none for cross-attention and the output bias, which the encoder has nothing to compute.
FROM_ENCODER_BLOCK = {"self_qkv": "qkv", "self_output": "attention_output", "self_norm": "attention_norm",
                      "ffn_inner": "ffn_inner", "ffn_gate": "ffn_gate", "ffn_output": "ffn_output", "ffn_norm": "ffn_norm"}
FROM_ENCODER = {"embeddings_norm": "embeddings_norm", "final_norm": "final_norm", "positions": "position_embedding",
                "decoder_token_embedding": "token_embedding"}


def encoder_counterpart(path: str) -> str | None:
    """"decoder/block_1/self_qkv/kernel" -> "block_1/qkv/kernel"; None where there is none (or
    the weight is not the decoder's own: a tied embedding is the encoder's)."""
    if not path.startswith("decoder/"):
        return None
    _, layer, *rest = path.split("/")
    if layer.startswith("block_"):
        inner = FROM_ENCODER_BLOCK.get(rest[0])
        return inner and f"{layer}/{inner}/{rest[1]}"
    return FROM_ENCODER.get(layer) and f"{FROM_ENCODER[layer]}/{rest[0]}"


@pytest.mark.parametrize("layout", [["model.norm=pre"], ["model.norm=post", "model.position=learned",
                                                         "model.tie_embeddings=false"],
                                    ["model.norm=pre", "model.use_bias=false", "model.glu=true"]],
                         ids=["pre", "post-learned", "no-bias-gated"])
@pytest.mark.parametrize("decoder_init", ["encoder", "random"])
def test_the_decoder_starts_from_the_pretrained_encoder(tmp_path, layout, decoder_init):
    """What a new seq2seq run with model.init_from does (run/session.py): with decoder_init
    encoder each decoder block's self-attention, feed-forward and LayerNorms are the encoder
    block's of its index (the norm and positions around the blocks too), cross-attention and
    the output bias their fresh values; with random the whole decoder is fresh."""
    from trainformer.run.session import start_from_pretrained

    sizes = ["model.d_model=32", "model.num_layers=2", "model.num_heads=2", "model.dff=64", *layout]
    keras.utils.set_random_seed(1)
    masked_lm = build_masked_lm(load_config(None, sizes).model, 100, 32)
    rng = np.random.default_rng(0)
    for weight in masked_lm.encoder.weights:  # "trained": no LayerNorm of ones, no bias of zeros left
        weight.assign(rng.normal(size=weight.shape).astype("float32"))
    Checkpoints(tmp_path / "checkpoints", 1, model=masked_lm, step=tf.Variable(0, dtype=tf.int64)).save(3)
    config = load_config(None, [*sizes, "task.type=seq2seq", f"model.init_from={tmp_path}",
                                f"model.decoder_init={decoder_init}"])

    def seq2seq():
        keras.utils.set_random_seed(2)
        return build_seq2seq(config.model, 100, 32, 16)

    fresh = {w.path: w.numpy() for w in seq2seq().decoder.weights}
    model, said = seq2seq(), []
    start_from_pretrained(config, model, said.append)
    pretrained = {w.path: w.numpy() for w in masked_lm.encoder.weights}
    copied = 0
    for weight in model.decoder.weights:
        ours, source = weight.numpy(), encoder_counterpart(weight.path)
        if not weight.path.startswith("decoder/"):  # the tied embedding: the encoder's own weight
            np.testing.assert_array_equal(ours, pretrained[weight.path])
        elif source is None or decoder_init == "random":
            np.testing.assert_array_equal(ours, fresh[weight.path])  # cross-attention, output bias: as built
            if source is not None:
                assert not np.array_equal(ours, pretrained[source][:len(ours)])
        else:
            np.testing.assert_array_equal(ours, pretrained[source][:len(ours)])  # positions: the first 16 rows
            assert not np.array_equal(ours, fresh[weight.path])
            copied += 1
    if decoder_init == "encoder":
        projections = 4 + config.model.glu  # their kernels (and biases), and 2 LayerNorms
        per_block = projections * (1 + config.model.use_bias) + 4
        assert copied == 2 * per_block + 2 + 2 * (layout[0] == "model.norm=post")  # blocks, a norm, positions, embedding
        assert said[-1] == "decoder: its 2 blocks start from the encoder's (model.decoder_init=encoder), " \
                           "cross-attention from random"
    else:
        assert len(said) == 1 and said[0].startswith("encoder: from ")
    assert any("cross_kv" in w.path for w in model.decoder.weights)
