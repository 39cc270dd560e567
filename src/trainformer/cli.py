"""`trainformer` command line: parse arguments, call one library function per verb."""

from __future__ import annotations

import argparse
import faulthandler
import gc
import importlib.metadata
import json
import os
import sys
from pathlib import Path

from trainformer import framework_import
from trainformer.errors import TrainingError, UserError
from trainformer.quiet import quiet_tensorflow
from trainformer.xla_flags import set_xla_flags

EXIT_USER_ERROR = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a process Ctrl-C stopped
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE: what `yes | head` reports for yes
CHECKPOINT_CHOICE = {"choices": ("latest", "best"), "default": None,
                     "help": "the newest checkpoint, or the best: by valid accuracy in a run with train.keep_best "
                             "(its default), else by valid loss (default: latest)"}


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

    for add_verb in (add_train, add_eval, add_predict, add_export, add_import, add_average, add_bench, add_launch,
                     add_doctor, add_diff, add_serve, add_data):
        add_verb(verb)
    return top


def add_train(verb) -> None:
    train = verb("train", help="train a model for its task: pretraining, classification or seq2seq "
                               "(resumes if RUN_DIR holds a run)")
    train.add_argument("config", nargs="?",
                       help="YAML file or built-in name (default: RUN_DIR's own config when it holds a run, "
                            "else zh-bert-tiny)")
    train.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                       help="override a config key, e.g. --set train.steps=200 (repeatable)")
    train.add_argument("--run-dir", type=Path, help="run directory (default: runs/<config name>)")
    train.add_argument("--metrics-port", type=int, metavar="P",
                       help="serve Prometheus metrics on 127.0.0.1:P while training")


def add_eval(verb) -> None:
    evaluate = verb("eval", help="score a run's checkpoint on held-out data")
    evaluate.add_argument("run_dir", type=Path, help="a run directory written by train")
    evaluate.add_argument("--split", choices=("valid", "test", "train"), default="valid",
                          help="held-out data (default), the test split of a classify run, or the training data")
    evaluate.add_argument("--checkpoint", **CHECKPOINT_CHOICE)
    evaluate.add_argument("--set", dest="overrides", action="append", default=[], metavar="decode.KEY=VALUE",
                          help="seq2seq: decode this time with other settings, e.g. --set decode.strategy=greedy "
                               "(decode.* keys only; repeatable)")
    evaluate.add_argument("--json", action="store_true", help="print one JSON object")


def add_predict(verb) -> None:
    predict = verb("predict", help="answer texts with a run's model: a label (classify), [MASK] fills (mlm), "
                                   "a translation or summary (seq2seq)")
    predict.add_argument("run_dir", type=Path, help="a run directory written by train (or import hf)")
    predict.add_argument("texts", nargs="*", metavar="TEXT", help="texts to answer (default: lines on stdin)")
    predict.add_argument("--checkpoint", **CHECKPOINT_CHOICE)
    predict.add_argument("--nbest", action="store_true",
                         help="seq2seq with beam search: also print every hypothesis of the beam with its score")


def add_export(verb) -> None:
    export = verb("export", help="add a version of a run's model to an export base, in TF Serving's layout: a "
                                 "SavedModel (text in), TFLite and ONNX, checked for parity")
    export.add_argument("run_dir", type=Path, help="a run directory written by train (or import hf)")
    export.add_argument("--format", metavar="F[,F]",
                        help="comma-separated: saved_model, tflite, onnx (default: all three; a seq2seq run: "
                             "saved_model); or hf alone: a Hugging Face BERT folder (default --out RUN_DIR/hf)")
    export.add_argument("--out", type=Path, metavar="BASE",
                        help="the export base folder, TF Serving's model base path: each export adds a version "
                             "folder BASE/<version> (default: RUN_DIR/export)")
    export.add_argument("--version", type=int, metavar="N",
                        help="the version's number (default: the checkpoint's step); versions are never replaced")
    export.add_argument("--keep", type=int, metavar="N", help="then remove all but the N newest versions of BASE")
    export.add_argument("--checkpoint", **CHECKPOINT_CHOICE)
    export.add_argument("--quantize", default="", metavar="Q[,Q]",
                        help="also write quantized TFLite models: dynamic (int8 weights), float16")
    export.add_argument("--set", dest="overrides", action="append", default=[], metavar="decode.KEY=VALUE",
                        help="seq2seq: the exported model decodes with these settings instead of the run's, e.g. "
                             "--set decode.beam_size=2 --set decode.max_length=64 (decode.* keys only; repeatable)")


def add_import(verb) -> None:
    importer = verb("import", help="turn another framework's checkpoint into a run directory")
    importer.add_argument("format", choices=("hf",), help="hf: a Hugging Face BERT folder (config.json, "
                                                          "model.safetensors, vocab.txt)")
    importer.add_argument("hf_dir", type=Path, metavar="HF_DIR")
    importer.add_argument("--run-dir", type=Path, required=True, help="the run directory to write (new or empty)")


def add_average(verb) -> None:
    average = verb("average", help="write a new run whose weights are the mean of a run's last checkpoints "
                                   "(latest weight averaging), to evaluate or to start fine-tunes from")
    average.add_argument("run_dir", type=Path, help="a run directory written by train")
    average.add_argument("--last", type=int, required=True, metavar="K",
                         help="how many of its newest checkpoints to average (a run keeps train.keep_checkpoints, "
                              "train.checkpoint_every steps apart)")
    average.add_argument("--run-dir", dest="target", type=Path, required=True, metavar="NEW_DIR",
                         help="the new run directory (must not exist)")


def add_bench(verb) -> None:
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


def add_launch(verb) -> None:
    launch = verb("launch", help="train with N local worker processes (MultiWorkerMirroredStrategy)",
                  usage="trainformer launch --workers N -- train [CONFIG] [--set KEY=VALUE ...]")
    launch.add_argument("--workers", type=int, required=True, metavar="N",
                        help="worker processes to start on this machine (127.0.0.1)")
    launch.add_argument("command", nargs=argparse.REMAINDER, help="'--' then the train command line")


def add_doctor(verb) -> None:
    doctor = verb("doctor", help="check the install, TensorFlow, GPUs, CPU and disk; exit 1 if a problem is found")
    doctor.add_argument("--run-dir", type=Path, default=Path("runs"),
                        help="where runs are written: its free disk is checked (default: runs)")
    doctor.add_argument("--json", action="store_true", help="print one JSON object: the facts and problems")


def add_diff(verb) -> None:
    diff = verb("diff", help="what differs between two runs; exit 0 same, 1 different (like diff)")
    diff.add_argument("run_a", type=Path, metavar="RUN_A", help="a run directory")
    diff.add_argument("run_b", type=Path, metavar="RUN_B", help="another run directory")
    diff.add_argument("--json", action="store_true", help="print one JSON object")


def add_serve(verb) -> None:
    serve = verb("serve", help="serve exported models over TF Serving's REST and gRPC APIs, with dynamic batching "
                               "and new versions picked up while running")
    serve.add_argument("base", type=Path, nargs="?", metavar="BASE",
                       help="an export base path (BASE/<version>/, as trainformer export writes): its highest "
                            "version is served")
    serve.add_argument("--model", action="append", default=[], metavar="NAME=BASE",
                       help="serve BASE as NAME; repeat it for several models")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this host only)")
    serve.add_argument("--port", type=int, default=8501,
                       help="REST port (default 8501, TF Serving's; 0: any free)")
    serve.add_argument("--grpc-port", type=int, default=8500,
                       help="gRPC port (default 8500, TF Serving's; 0: any free)")
    serve.add_argument("--no-grpc", action="store_true", help="serve REST only")
    serve.add_argument("--poll-seconds", type=float, default=1.0,
                       help="how often each BASE is checked for a new version folder (default 1)")
    serve.add_argument("--name", help="BASE's name in URLs (default: the exported run's name, else BASE's "
                                      "folder name)")
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


def add_data(verb) -> None:
    data = verb("data", help="built-in corpora")
    data.add_argument("action", choices=("list",), help="list: each recipe, what it is and its size here")


def version() -> str:
    """trainformer's version and the stack it runs on (read from package metadata: no imports)."""
    def installed(name: str) -> str:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return "not installed"

    stack = ", ".join(f"{name} {installed(name)}" for name in ("tensorflow", "keras", "tensorflow-text"))
    return f"trainformer {installed('trainformer')} ({stack})"


def command() -> None:
    """The `trainformer` command (its console script and `python -m trainformer`): main() as the
    whole life of a process, which imports TensorFlow and Keras with the cycle collector off
    (framework_import.py) and freezes everything before it exits, so that Python's last passes
    walk none of it. main() called in-process (tests, notebooks) leaves the collector alone."""
    framework_import.install()
    status = main()
    gc.freeze()
    sys.exit(status)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    quiet_tensorflow(args.debug)  # before TensorFlow loads: its own log lines only with --debug
    set_xla_flags()  # before XLA compiles anything: xla_flags.py
    # a crash in native code (SIGSEGV, SIGABRT) prints the Python stack it happened under; fd 2, not
    # sys.stderr: that may be a stream without a file (main called in-process, output captured)
    faulthandler.enable(file=2)
    try:
        status = run(args)
        sys.stdout.flush()  # here, not at exit: a reader that has gone away is handled below
        return status
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
        print("trainformer: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader stopped reading (`| head`): not an error of ours. Python would flush stdout
        # again at exit and fail the same way, so stdout now points at /dev/null.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE


def run(args: argparse.Namespace) -> int:
    return VERBS[args.verb](args)


def run_doctor(args: argparse.Namespace) -> int:
    from trainformer.ops.doctor import check, format_report

    facts = check(args.run_dir)
    print(json.dumps(facts) if args.json else format_report(facts))
    return 1 if facts["problems"] else 0


def run_diff(args: argparse.Namespace) -> int:
    from trainformer.ops.diff import diff_runs, format_differences

    differences = diff_runs(args.run_a, args.run_b)
    print(json.dumps({"identical": not differences, "differences": differences}, ensure_ascii=False)
          if args.json else format_differences(differences))
    return 1 if differences else 0


def run_serve(args: argparse.Namespace) -> int:
    from trainformer.serve.server import Limits, Settings, serve

    limits = Limits(max_body_bytes=int(args.max_body_mb * (1 << 20)), max_instances=args.max_instances)
    settings = Settings(args.host, args.port, None if args.no_grpc else args.grpc_port, args.max_batch,
                        args.batch_timeout_ms, args.max_queue, args.poll_seconds, limits, args.access_log)
    return serve(serve_models(args), settings)


def serve_models(args: argparse.Namespace) -> dict:
    """{name or None: base path} from BASE [--name NAME] and each --model NAME=BASE."""
    if args.base is None and not args.model:
        raise UserError("serve needs a base path: trainformer serve BASE, or --model NAME=BASE")
    if args.name and args.base is None:
        raise UserError("--name names BASE: give BASE, or use --model NAME=BASE")
    models = {} if args.base is None else {args.name: args.base}
    for spec in args.model:
        name, equals, base = spec.partition("=")
        if not equals or not name or not base:
            raise UserError(f"--model {spec!r}: write it NAME=BASE")
        if name in models:
            raise UserError(f"--model {spec!r}: the name {name!r} is given twice")
        models[name] = Path(base)
    return models


def run_data(args: argparse.Namespace) -> int:
    from trainformer.data.recipes import RECIPES

    for recipe in RECIPES.values():
        print(f"{recipe.name:22s} {recipe.description}", flush=True)
        if recipe.kind != "parallel":  # pairs would need both languages parsed: seconds more
            print(f"{'':22s} {recipe_size_line(recipe.name)}", flush=True)  # each as soon as it is read
    return 0


def recipe_size_line(name: str) -> str:
    """What a text or labelled recipe holds here, read now, or the command that installs it."""
    from trainformer.data.corpus import recipe_size
    from trainformer.errors import NotInstalled

    try:
        documents, characters = recipe_size(name)
    except NotInstalled as missing:
        return f"not installed: {missing.install}"
    return f"{documents:,} documents, {characters:,} characters"


def run_launch(args: argparse.Namespace) -> int:
    from trainformer.launch import launch
    from trainformer.run_dir import resolve_train_config

    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if command[:1] == ["train"]:  # a bad config fails here once, not in every worker
        train = parser().parse_args(command)
        resolve_train_config(train.config, train.overrides, train.run_dir)
    return launch(args.workers, command)


def run_train(args: argparse.Namespace) -> int:
    from trainformer.run_dir import resolve_train_config

    config, run = resolve_train_config(args.config, args.overrides, args.run_dir)  # before TensorFlow loads
    from trainformer.run.start import interrupted_line, start_training

    try:
        start_training(config, run, metrics_port=args.metrics_port)
    except KeyboardInterrupt:  # before the loop took over Ctrl-C, or a second Ctrl-C: nothing saved now
        print(f"trainformer: {interrupted_line(run)}", file=sys.stderr)
        return EXIT_INTERRUPTED
    return 0


def run_bench(args: argparse.Namespace) -> int:
    from trainformer.run_dir import load_starting_config

    config = load_starting_config(args.config, args.overrides)  # a fine-tune: its init_from's sizes
    from trainformer.ops.bench import bench, format_result

    result = bench(config, args.steps, args.warmup, args.synthetic, args.cache_dir, say_for(args))
    print(json.dumps(result) if args.json else format_result(result))
    return 0


def check_run_dir(path: Path, checkpoint: bool = True, overrides=()) -> None:
    """A path that holds no run, (checkpoint) a run with no checkpoint yet, or a --set the run
    cannot take (eval and export take decode.* on a seq2seq run) fails here in a fraction of a
    second, before TensorFlow loads."""
    from trainformer.config import with_decode_overrides
    from trainformer.run_dir import RunDir

    run = RunDir(path)
    with_decode_overrides(run.load_config(), overrides)
    if checkpoint:
        run.require_checkpoint()


def run_predict(args: argparse.Namespace) -> int:
    check_run_dir(args.run_dir)
    from trainformer.run.inference import predictor

    answer = predictor(args.run_dir, which=args.checkpoint, nbest=args.nbest, warn=say_on_stderr)
    for chunk in text_chunks(args.texts or (line.rstrip("\n") for line in sys.stdin)):
        for result in answer(chunk):
            print(json.dumps(result, ensure_ascii=False), flush=True)
    return 0


def run_export(args: argparse.Namespace) -> int:
    if "hf" in (args.format or "").split(","):
        return run_export_hf(args)
    check_run_dir(args.run_dir, overrides=args.overrides)
    from trainformer.export import export_run
    from trainformer.export.parity import failures

    quantize = tuple(q for q in args.quantize.split(",") if q)
    formats = tuple(f for f in args.format.split(",") if f) if args.format else None  # None: the task's
    metadata = export_run(args.run_dir, args.out, formats=formats, which=args.checkpoint, quantize=quantize,
                          version=args.version, keep=args.keep, overrides=args.overrides)
    problems = failures(metadata["parity"], quantize)
    for line in problems:
        print(f"trainformer: parity failed: {line}", file=sys.stderr)
    return 1 if problems else 0


def run_export_hf(args: argparse.Namespace) -> int:
    """--format hf writes a folder of its own (transformers' file names): not combined with the others."""
    if args.format != "hf" or args.quantize or args.version or args.keep or args.overrides:
        raise UserError("--format hf: give it alone, without --quantize, --version, --keep or --set (a Hugging Face "
                        "folder is an export of its own: write the other formats with another command and --out)")
    check_run_dir(args.run_dir, checkpoint=False)  # a setting BERT cannot express comes first: training cannot fix it
    from trainformer.interop.hf_export import export_hf

    export_hf(args.run_dir, args.out or args.run_dir / "hf", which=args.checkpoint)
    return 0


def run_import(args: argparse.Namespace) -> int:
    from trainformer.interop.hf_import import import_hf_bert

    import_hf_bert(args.hf_dir, args.run_dir)
    return 0


def run_average(args: argparse.Namespace) -> int:
    check_run_dir(args.run_dir)
    from trainformer.run.average import average_run

    average_run(args.run_dir, args.target, args.last)
    return 0


def run_eval(args: argparse.Namespace) -> int:
    check_run_dir(args.run_dir, overrides=args.overrides)
    from trainformer.run.inference import evaluate, format_metrics

    result = evaluate(args.run_dir, split=args.split, which=args.checkpoint, overrides=args.overrides,
                      say=say_on_stderr)
    print(json.dumps(result, ensure_ascii=False) if args.json else format_metrics(result))
    return 0


VERBS = {"train": run_train, "eval": run_eval, "predict": run_predict, "export": run_export, "import": run_import,
         "average": run_average, "bench": run_bench, "launch": run_launch, "doctor": run_doctor, "diff": run_diff,
         "serve": run_serve, "data": run_data}


def say_on_stderr(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def say_for(args: argparse.Namespace):
    """Where a verb's progress lines go: stderr under --json, so stdout holds the JSON only."""
    return say_on_stderr if args.json else print


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
    command()
