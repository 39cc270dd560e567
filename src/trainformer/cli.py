"""`trainformer` command line: parse arguments, call one library function per verb."""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import sys
from pathlib import Path

from trainformer.errors import TrainingError, UserError
from trainformer.quiet import quiet_tensorflow

EXIT_USER_ERROR = 2


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="trainformer", description="Train Transformers on TensorFlow.")
    top.add_argument("--version", action="version", version=version())
    # --debug goes before or after the verb; SUPPRESS: a verb's parser must not reset it to False
    debug = argparse.ArgumentParser(add_help=False)
    debug.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                       help="show tracebacks and TensorFlow's own logging")
    top.add_argument("--debug", action="store_true", help="show tracebacks and TensorFlow's own logging")
    verbs = top.add_subparsers(dest="verb", required=True)

    def verb(name: str, **kwargs) -> argparse.ArgumentParser:
        return verbs.add_parser(name, parents=[debug], **kwargs)

    train = verb("train", help="pretrain a model (resumes if RUN_DIR holds a run)")
    train.add_argument("config", nargs="?",
                       help="YAML file or built-in name (default: RUN_DIR's own config when it holds a run, "
                            "else zh-bert-tiny)")
    train.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                       help="override a config key, e.g. --set train.steps=200 (repeatable)")
    train.add_argument("--run-dir", type=Path, help="run directory (default: runs/<config name>)")
    train.add_argument("--metrics-port", type=int, metavar="P",
                       help="serve Prometheus metrics on 127.0.0.1:P while training")

    evaluate = verb("eval", help="score a run's checkpoint on held-out data")
    evaluate.add_argument("run_dir", type=Path, help="a run directory written by train")
    evaluate.add_argument("--split", choices=("valid", "test", "train"), default="valid",
                          help="held-out data (default), the test split of a classify run, or the training data")
    evaluate.add_argument("--checkpoint", choices=("latest", "best"), default="latest",
                          help="the newest checkpoint (default) or the one with the lowest valid loss")
    evaluate.add_argument("--json", action="store_true", help="print one JSON object")

    predict = verb("predict", help="answer texts with a run's model: a label (classify), [MASK] fills (mlm), "
                                   "a translation or summary (seq2seq)")
    predict.add_argument("run_dir", type=Path, help="a run directory written by train (or import hf)")
    predict.add_argument("texts", nargs="*", metavar="TEXT", help="texts to answer (default: lines on stdin)")
    predict.add_argument("--checkpoint", choices=("latest", "best"), default="latest",
                         help="the newest checkpoint (default) or the one with the lowest valid loss")
    predict.add_argument("--nbest", action="store_true",
                         help="seq2seq with beam search: also print every hypothesis of the beam with its score")

    export = verb("export", help="write a run's model as a SavedModel (text in), TFLite and ONNX, checked for parity")
    export.add_argument("run_dir", type=Path, help="a run directory written by train (or import hf)")
    export.add_argument("--format", default="saved_model,tflite,onnx", metavar="F[,F]",
                        help="comma-separated: saved_model, tflite, onnx (default: all three)")
    export.add_argument("--out", type=Path, help="the export directory (default: RUN_DIR/export; an earlier "
                                                 "export there is replaced)")
    export.add_argument("--checkpoint", choices=("latest", "best"), default="latest",
                        help="the newest checkpoint (default) or the one with the lowest valid loss")
    export.add_argument("--quantize", default="", metavar="Q[,Q]",
                        help="also write quantized TFLite models: dynamic (int8 weights), float16")

    importer = verb("import", help="turn another framework's checkpoint into a run directory")
    importer.add_argument("format", choices=("hf",), help="hf: a Hugging Face BERT folder (config.json, "
                                                          "model.safetensors, vocab.txt)")
    importer.add_argument("hf_dir", type=Path, metavar="HF_DIR")
    importer.add_argument("--run-dir", type=Path, required=True, help="the run directory to write (new or empty)")

    bench = verb("bench", help="time a config's training step: tokens/s, MFU, data-wait")
    bench.add_argument("config", nargs="?", help="YAML file or built-in name, as for train")
    bench.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                       help="override a config key, as for train (repeatable)")
    bench.add_argument("--steps", type=int, default=20, help="timed steps (default 20)")
    bench.add_argument("--warmup", type=int, default=3, help="untimed steps first, incl. compilation (default 3)")
    bench.add_argument("--synthetic", action="store_true",
                       help="random fixed-length ids from memory instead of the config's corpus")
    bench.add_argument("--cache-dir", type=Path,
                       help="vocabulary and token cache for real text (default: runs/bench-<config name>)")
    bench.add_argument("--json", action="store_true", help="print one JSON object")

    launch = verb("launch", help="train with N local worker processes (MultiWorkerMirroredStrategy)",
                  usage="trainformer launch --workers N -- train [CONFIG] [--set KEY=VALUE ...]")
    launch.add_argument("--workers", type=int, required=True, metavar="N",
                        help="worker processes to start on this machine (127.0.0.1)")
    launch.add_argument("command", nargs=argparse.REMAINDER, help="'--' then the train command line")

    doctor = verb("doctor", help="check the install, TensorFlow, GPUs, CPU and disk; exit 1 if a problem is found")
    doctor.add_argument("--run-dir", type=Path, default=Path("runs"),
                        help="where runs are written: its free disk is checked (default: runs)")
    doctor.add_argument("--json", action="store_true", help="print one JSON object: the facts and problems")

    diff = verb("diff", help="what differs between two runs; exit 0 same, 1 different (like diff)")
    diff.add_argument("run_a", type=Path, metavar="RUN_A", help="a run directory")
    diff.add_argument("run_b", type=Path, metavar="RUN_B", help="another run directory")
    diff.add_argument("--json", action="store_true", help="print one JSON object")

    serve = verb("serve", help="serve an exported model over TF Serving's REST API, with dynamic batching")
    serve.add_argument("model_dir", type=Path, metavar="MODEL_DIR", help="a folder written by trainformer export")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this host only)")
    serve.add_argument("--port", type=int, default=8501, help="port (default 8501, TF Serving's REST port; 0: any free)")
    serve.add_argument("--name", help="the model's name in URLs (default: MODEL_DIR's folder name)")
    serve.add_argument("--max-batch", type=int, default=64,
                       help="most instances merged into one model call (default 64; 1 turns batching off)")
    serve.add_argument("--batch-timeout-ms", type=float, default=0.0,
                       help="how long a batch waits for more requests; 0 (default): merge only those already "
                            "waiting, which under load is most of them")
    serve.add_argument("--max-instances", type=int, default=1024, help="most instances per request (default 1024)")
    serve.add_argument("--max-body-mb", type=float, default=4.0, help="largest request body in MiB (default 4)")
    serve.add_argument("--max-queue", type=int, default=4096,
                       help="most instances waiting for the model; beyond it requests get 503 (default 4096)")
    serve.add_argument("--access-log", action="store_true", help="log every request (uvicorn's access log)")

    data = verb("data", help="built-in corpora")
    data.add_argument("action", choices=("list",), help="list: name and description of each recipe")
    return top


def version() -> str:
    """trainformer's version and the stack it runs on (read from package metadata: no imports)."""
    def installed(name: str) -> str:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return "not installed"

    stack = ", ".join(f"{name} {installed(name)}" for name in ("tensorflow", "keras", "tensorflow-text"))
    return f"trainformer {installed('trainformer')} ({stack})"


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    quiet_tensorflow(args.debug)  # before TensorFlow loads: its own log lines only with --debug
    try:
        return run(args)
    except UserError as err:
        if args.debug:
            raise
        print(f"trainformer: error: {err}", file=sys.stderr)
        return EXIT_USER_ERROR
    except TrainingError as err:
        if args.debug:
            raise
        print(f"trainformer: training stopped: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("trainformer: interrupted; rerun the same command to resume from the last checkpoint", file=sys.stderr)
        return 130


def run(args: argparse.Namespace) -> int:
    if args.verb == "doctor":
        from trainformer.ops.doctor import check, format_report

        facts = check(args.run_dir)
        print(json.dumps(facts) if args.json else format_report(facts))
        return 1 if facts["problems"] else 0

    if args.verb == "diff":
        from trainformer.ops.diff import diff_runs, format_differences

        differences = diff_runs(args.run_a, args.run_b)
        print(json.dumps({"identical": not differences, "differences": differences}, ensure_ascii=False)
              if args.json else format_differences(differences))
        return 1 if differences else 0

    if args.verb == "serve":
        from trainformer.serve.server import Limits, serve

        limits = Limits(max_body_bytes=int(args.max_body_mb * (1 << 20)), max_instances=args.max_instances)
        return serve(args.model_dir, args.host, args.port, args.name, max_batch=args.max_batch,
                     batch_timeout_ms=args.batch_timeout_ms, max_queue=args.max_queue, limits=limits,
                     access_log=args.access_log)

    if args.verb == "data":
        from trainformer.data.recipes import RECIPES

        for recipe in RECIPES.values():
            print(f"{recipe.name:22s} {recipe.description}")
        return 0

    from trainformer.config import load_config
    from trainformer.run_dir import resolve_train_config

    if args.verb == "launch":
        from trainformer.launch import launch

        command = args.command[1:] if args.command[:1] == ["--"] else args.command
        if command[:1] == ["train"]:  # a bad config fails here once, not in every worker
            train = parser().parse_args(command)
            resolve_train_config(train.config, train.overrides, train.run_dir)
        return launch(args.workers, command)

    if args.verb == "train":
        config, run = resolve_train_config(args.config, args.overrides, args.run_dir)  # before TensorFlow loads
        from trainformer.run.start import start_training

        start_training(config, run, metrics_port=args.metrics_port)
        return 0

    if args.verb == "bench":
        config = load_config(args.config, args.overrides)
        from trainformer.ops.bench import bench, format_result

        say = (lambda text: print(text, file=sys.stderr)) if args.json else print  # stdout: the JSON only
        result = bench(config, args.steps, args.warmup, args.synthetic, args.cache_dir, say)
        print(json.dumps(result) if args.json else format_result(result))
        return 0

    if args.verb == "predict":
        from trainformer.run.inference import predictor

        answer = predictor(args.run_dir, which=args.checkpoint, nbest=args.nbest)
        for chunk in text_chunks(args.texts or (line.rstrip("\n") for line in sys.stdin)):
            for result in answer(chunk):
                print(json.dumps(result, ensure_ascii=False), flush=True)
        return 0

    if args.verb == "export":
        from trainformer.export import export_run
        from trainformer.export.parity import failures

        quantize = tuple(q for q in args.quantize.split(",") if q)
        metadata = export_run(args.run_dir, args.out, formats=tuple(f for f in args.format.split(",") if f),
                              which=args.checkpoint, quantize=quantize)
        problems = failures(metadata["parity"], quantize)
        for line in problems:
            print(f"trainformer: parity failed: {line}", file=sys.stderr)
        return 1 if problems else 0

    if args.verb == "import":
        from trainformer.interop.hf_import import import_hf_bert

        import_hf_bert(args.hf_dir, args.run_dir)
        return 0

    from trainformer.run.inference import evaluate

    result = evaluate(args.run_dir, split=args.split, which=args.checkpoint)
    if args.json:
        print(json.dumps(result, ensure_ascii=False))
    else:
        for key, value in result.items():
            print(f"{key:18s} {value:.4f}" if isinstance(value, float) else f"{key:18s} {value}")
    return 0


def text_chunks(texts, size: int = 64):
    """Lists of up to size non-empty texts: predict answers a stream of lines as it comes."""
    chunk = []
    for text in texts:
        if text.strip():
            chunk.append(text)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


if __name__ == "__main__":
    sys.exit(main())
