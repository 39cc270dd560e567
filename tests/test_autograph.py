"""No function of ours goes through AutoGraph: the training steps, evaluations, input
pipelines and serving functions are graph code as written (explicit tf.cond and
tf.while_loop), and converting them cost ~2 s of every process's start on a 2-core CPU.
conftest's shared runs are built by processes that list what AutoGraph converted
(env_with_autograph_probe): a masked LM's training, a classifier's training and export, and a
seq2seq training with its decoding."""

# tf.saved_model.save wraps each signature in a tf.function of its own, which AutoGraph
# converts (tensorflow/python/saved_model/signature_serialization.py): TensorFlow's, not ours.
SAVED_MODEL_WRAPPERS = {"signature_wrapper", "serving_default"}


def test_training_exporting_and_decoding_convert_nothing(intent_pretraining, intent_export, headline_run):
    for root in (intent_pretraining.parent, intent_export.run_dir.parent, headline_run[0].parent):
        processes = [line.split() for line in (root / "autograph.txt").read_text(encoding="utf-8").splitlines()]
        assert processes and {verb for verb, *_ in processes} <= {"train", "export"}
        converted = [(verb, name) for verb, *names in processes for name in names if name not in SAVED_MODEL_WRAPPERS]
        assert converted == [], f"AutoGraph converted functions while building {root.name}: {converted}"
