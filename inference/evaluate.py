"""Evaluate a method in the search environment.

    python -m inference.evaluate --method seeds-react --data data/hotpot.jsonl --limit 500 \\
        --llm hf:/models/qwen --index indexes/wiki18-e5 --out runs/seeds-react-hotpot
    python -m inference.evaluate --method vanilla-rag --limit 20 --out runs/rag   # embedded default
    python -m inference.evaluate --compare runs/rag runs/seeds-react   # paired bootstrap -> runs/rag/compare.json

Without ``--data``, ``--llm`` and ``--index`` it runs on the embedded default: questions
generated from the Wikipedia-summaries corpus, Gemma 3 270M (hf backend) and the default MiniLM
index (built on first use). Predictions are appended to ``<out>/predictions.jsonl`` as they
finish, so a killed run resumes where it stopped; ``metrics.json`` and ``config.json`` sit beside.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Any

import yaml
from tqdm import tqdm

import methods
from envs.atomic import write_json_atomic
from envs.config import EnvConfig
from envs.data import load_questions
from envs.retrieval.defaults import open_run_retriever
from envs.typed_config import ConfigError, read_recipe
from inference.backends import load_backend
from inference.compare import compare_runs, format_comparison
from inference.predictions import PredictionWriter, load_predictions
from inference.run_metrics import format_table, summarize, with_current_names
from methods.runner import run_questions_sync

DEFAULT_LLM = "hf:gemma3-270m"
DEFAULT_QUESTIONS = 100


def _value(text: str) -> Any:
    """``key=value`` option values: YAML scalars (ints, floats, booleans), else the string."""
    return yaml.safe_load(text)


def parse_options(pairs: list[str] | None, flag: str) -> dict[str, Any]:
    options = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"{flag} expects key=value, got {pair!r}")
        options[key.replace("-", "_")] = _value(value)
    return options


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m inference.evaluate", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", help="YAML file of these options (command-line flags override it)")
    parser.add_argument("--method", help="a registered method: " + ", ".join(_methods()))
    parser.add_argument("--method-option", action="append", metavar="KEY=VALUE", help="e.g. k=3 (repeatable)")
    parser.add_argument("--variant", help="a method's variant or ablation, e.g. seek: parallel_filling, plan, update, "
                                          "no_iter_retrieval, no_initialization; kair: qa_with_docs_only, "
                                          "qa_with_index_only, no_index, no_evolving; maps: no_retrieval_direction, "
                                          "no_parallel, no_disentanglement (same as --method-option variant=...)")
    parser.add_argument("--data", help="FlashRAG JSONL / HotpotQA JSON path, or a Hugging Face dataset name")
    parser.add_argument("--split", default="test", help="split of a hub dataset (default test)")
    parser.add_argument("--limit", type=int, help=f"first N questions (default questions: {DEFAULT_QUESTIONS})")
    parser.add_argument("--llm", help=f"backend:model, e.g. hf:smollm2-135m, vllm:/models/x, openai:gpt-4o-mini "
                                      f"(default {DEFAULT_LLM})")
    parser.add_argument("--llm-option", action="append", metavar="KEY=VALUE",
                        help="backend options, e.g. max_batch_size=8 or base_url=http://127.0.0.1:8000/v1")
    parser.add_argument("--index", help="index directory from scripts/build_index.py (default: embedded)")
    parser.add_argument("--corpus", help="corpus file, when it moved since the index was built")
    parser.add_argument("--retriever", metavar="URL", help="a retrieval server (python -m envs.retrieval.server), e.g. "
                                                           "http://127.0.0.1:8000, instead of --index")
    parser.add_argument("--env-config", help="YAML env recipe (the method then sets its own mode and limits)")
    parser.add_argument("--out", help="run folder (predictions.jsonl, metrics.json, config.json)")
    parser.add_argument("--concurrency", type=int, default=32, help="questions in flight at once")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-llm-calls", type=int, default=64, help="per question")
    parser.add_argument("--overwrite", action="store_true", help="discard an existing run in --out")
    parser.add_argument("--wandb", action="store_true", help="log to Weights & Biases (offline without a key)")
    parser.add_argument("--wandb-project", default="seeds-rl")
    parser.add_argument("--compare", nargs="+", metavar="RUN",
                        help="print these runs' metrics side by side, then each run against the first: paired "
                             "bootstrap 95%% intervals of the differences (also in compare.json in --out, "
                             "default the first run's folder)")
    return parser


def _methods() -> list[str]:
    return methods.available()


def resolve_args(argv: list[str] | None) -> argparse.Namespace:
    """Command line over ``--config`` YAML over defaults (the TRL recipe convention)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.config:
        try:
            recipe = read_recipe(Path(args.config))  # the project's one recipe reader (`base:` allowed)
        except ConfigError as err:
            raise SystemExit(f"--config: {err}") from err
        known = {a.dest for a in parser._actions}
        unknown = {k.replace("-", "_") for k in recipe} - known
        if unknown:
            raise SystemExit(f"{args.config}: unknown option(s) {sorted(unknown)}")
        parser.set_defaults(**{k.replace("-", "_"): v for k, v in recipe.items()})
        args = parser.parse_args(argv)
    if not args.compare and (not args.method or not args.out):
        parser.error("--method and --out are required (or --compare RUN [RUN ...])")
    return args


def run_config(args: argparse.Namespace, method, env_config) -> dict:
    """What defines the run; a resumed run must match it."""
    return {
        "method": args.method,
        "method_options": method.options(),
        "data": args.data or f"default-questions(seed={args.seed})",
        "split": args.split,
        "limit": args.limit,
        "llm": args.llm or DEFAULT_LLM,
        "llm_options": parse_options(args.llm_option, "--llm-option"),
        "index": args.retriever or args.index or "default",
        "env": dataclasses.asdict(env_config),
        "seed": args.seed,
        "max_llm_calls": args.max_llm_calls,
    }


def load_examples(args: argparse.Namespace):
    examples = load_questions(args.data, split=args.split, limit=args.limit if args.data else
                              args.limit or DEFAULT_QUESTIONS, seed=args.seed)
    ids = [e.id for e in examples]
    duplicates = sorted({i for i in ids if ids.count(i) > 1}) if len(set(ids)) != len(ids) else []
    if duplicates:
        raise SystemExit(f"question ids must be unique to resume safely; repeated: {duplicates[:5]}")
    return examples


def load_retriever(args: argparse.Namespace):
    """``--retriever URL`` (a retrieval server), else ``--index`` (a folder or a URL), else the default."""
    return open_run_retriever(args.retriever, args.index, args.corpus)


def prepare_run_dir(out: Path, config: dict, overwrite: bool) -> list[dict]:
    """Create or reopen ``out``; returns the predictions already there (to skip)."""
    out.mkdir(parents=True, exist_ok=True)
    config_path = out / "config.json"
    if overwrite:
        for name in ("predictions.jsonl", "metrics.json", "config.json"):
            (out / name).unlink(missing_ok=True)
    elif config_path.exists():
        previous, current = json.loads(config_path.read_text()), json.loads(json.dumps(config))
        if previous != current:
            changed = sorted(k for k in set(previous) | set(current) if previous.get(k) != current.get(k))
            raise SystemExit(f"{out} holds a run with a different configuration ({', '.join(changed)}); "
                             f"use another --out or --overwrite")
    write_json_atomic(config, config_path)
    return load_predictions(out / "predictions.jsonl")


def build_method(args: argparse.Namespace):
    """The method with its ``--method-option`` values and ``--variant``; bad options exit with the reason."""
    options = parse_options(args.method_option, "--method-option")
    if args.variant:
        if options.get("variant", args.variant) != args.variant:
            raise SystemExit(f"--variant {args.variant} contradicts --method-option variant={options['variant']}")
        options["variant"] = args.variant
    try:
        return methods.get(args.method, **options)
    except (KeyError, TypeError, ValueError) as err:
        raise SystemExit(f"--method {args.method}: {err}") from err


def evaluate(args: argparse.Namespace) -> dict:
    method = build_method(args)
    base_env = EnvConfig.from_yaml(args.env_config) if args.env_config else EnvConfig()
    config = run_config(args, method, method.env_config(base_env))
    out = Path(args.out)
    done = prepare_run_dir(out, config, args.overwrite)
    examples = load_examples(args)
    wanted = {e.id for e in examples}
    done = [r for r in done if r["id"] in wanted]
    todo = [e for e in examples if e.id not in {r["id"] for r in done}]
    print(f"{args.method}: {len(examples)} questions, {len(done)} already done, {len(todo)} to run -> {out}",
          file=sys.stderr)
    if todo:
        llm = load_backend(args.llm or DEFAULT_LLM, **config["llm_options"])
        retriever = load_retriever(args)
        bar = tqdm(total=len(todo), desc=args.method, unit="q")
        with PredictionWriter(out / "predictions.jsonl", {r["id"] for r in done}) as writer:
            def on_result(record: dict) -> None:
                writer.write(record)
                bar.update(1)

            run_questions_sync(method, todo, llm, retriever, base_env, concurrency=args.concurrency,
                               seed=args.seed, max_llm_calls=args.max_llm_calls, on_result=on_result)
        bar.close()
        llm.close()
    records = [r for r in load_predictions(out / "predictions.jsonl") if r["id"] in wanted]
    metrics = summarize(records)
    write_json_atomic(metrics, out / "metrics.json")
    print(format_table({args.method: metrics}))
    if args.wandb:
        log_to_wandb(args, config, metrics, records)
    return metrics


def log_to_wandb(args: argparse.Namespace, config: dict, metrics: dict, records: list[dict]) -> None:
    try:
        import wandb
    except ImportError as err:
        raise SystemExit("--wandb needs the wandb package: pip install wandb") from err
    mode = "online" if os.environ.get("WANDB_API_KEY") else "offline"
    run = wandb.init(project=args.wandb_project, name=Path(args.out).name, config=config, mode=mode,
                     dir=str(Path(args.out)))
    run.summary.update({k: v for k, v in metrics.items() if isinstance(v, (int, float))})
    table = wandb.Table(columns=["id", "question", "prediction", "golden_answers", "em", "searches", "docs_read"])
    for r in records[:500]:
        table.add_data(r["id"], r["question"], r["prediction"], ", ".join(r["golden_answers"]), r["metrics"]["em"],
                       r["n_searches"], r["docs_read"])
    run.log({"predictions": table})
    run.finish()
    if mode == "offline":
        print(f"W&B: no WANDB_API_KEY, logged offline under {Path(args.out) / 'wandb'}; upload with `wandb sync`",
              file=sys.stderr)


def compare(runs: list[str]) -> str:
    rows = {}
    for run in runs:
        path = Path(run) / "metrics.json"
        if path.exists():
            rows[Path(run).name] = with_current_names(json.loads(path.read_text()))
        elif (Path(run) / "predictions.jsonl").exists():  # an unfinished run: summarise what is there
            rows[Path(run).name] = summarize(load_predictions(Path(run) / "predictions.jsonl", repair=False))
        else:
            raise SystemExit(f"{run}: no metrics.json or predictions.jsonl")
    return format_table(rows)


def compare_paired(runs: list[str], out: str | None) -> str:
    """The paired bootstrap of every run against the first, written to ``compare.json`` in ``out``
    (default: the first run's folder)."""
    missing = [run for run in runs if not (Path(run) / "predictions.jsonl").exists()]
    if missing:
        return f"no paired comparison: {', '.join(missing)} has no predictions.jsonl"
    comparison = compare_runs(runs)
    target = Path(out or runs[0]) / "compare.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(comparison, target)
    return f"{format_comparison(comparison)}\n\n(written to {target})"


def main(argv: list[str] | None = None) -> int:
    args = resolve_args(argv)
    if args.compare:
        print(compare(args.compare))
        if len(args.compare) > 1:
            print("\n" + compare_paired(args.compare, args.out))
        return 0
    evaluate(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
