"""Evaluate a method in the search environment.

    python -m inference.evaluate --method seeds-react --data data/hotpot.jsonl --limit 500 \\
        --llm hf:/models/qwen --index indexes/wiki18-e5 --out runs/seeds-react-hotpot
    python -m inference.evaluate --method vanilla-rag --limit 20 --out runs/rag   # embedded default
    python -m inference.evaluate --compare runs/rag runs/seeds-react   # paired bootstrap -> runs/rag/compare.json
    accelerate launch --multi_gpu --num_processes 8 -m inference.evaluate ...   # data-parallel: one engine per GPU

Without ``--data``, ``--llm`` and ``--index`` it runs on the embedded default: questions
generated from the Wikipedia-summaries corpus, SmolLM2-135M-Instruct (hf backend) and the default
MiniLM index (built on first use). Agent turns are guided to the method's action format on the hf
and vllm backends unless ``--no-guided-actions``. Predictions are appended to ``<out>/predictions.jsonl`` as they
finish, so a killed run resumes where it stopped; ``metrics.json`` and ``config.json`` sit beside, and
``config.yaml``, the same settings in the form training writes (old run folders with ``config.json``
alone still resume, merge and compare). Env settings are ``--env.<field> value`` as in training
(``--env.max_actions 6``, ``--env.reward.positive_opened_bonus 0.2``) or ``--env field=value``.
Under a launcher (or with ``--shard i/n``) each process runs its shard of the questions into the
same folder (:mod:`inference.shards`).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import sys
from pathlib import Path

import yaml
from tqdm import tqdm

import methods
from envs.atomic import write_json_atomic, write_text_atomic
from envs.config import EnvConfig
from envs.data import load_questions
from envs.question_match import QuestionMismatchError, check_same_questions, question_digest, record_digests
from envs.retrieval.defaults import open_run_retriever
from envs.typed_config import ConfigError, config_help, read_recipe, section_pairs
from inference.backends import load_backend
from inference.backends.chat import THINKING_MODES
from inference.compare import CompareError, compare_runs, format_comparison
from inference.predictions import PredictionsFileError, PredictionWriter, load_predictions
from inference.run_metrics import format_table, summarize, with_current_names
from inference.run_setup import (
    DEFAULT_LLM,
    backend_options,
    build_env,
    build_method,
    parse_options,
    resolve_guided_actions,
)
from inference.shards import (
    clear_shards,
    merge_run,
    pin_devices,
    predictions_file,
    read_plan,
    resolve_shard,
    run_records,
    shard_files,
    write_plan,
)
from methods.budgets import PRESETS
from methods.runner import run_questions_sync

DEFAULT_QUESTIONS = 100
ENV_HELP_HEAD = ("env settings (--env.KEY VALUE, as in training, or --env KEY=VALUE), over the method's paper "
                 "limits and --env-config;\ndefaults are EnvConfig's own (a method sets its limits over them):\n")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m inference.evaluate", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=ENV_HELP_HEAD
                                     + config_help(EnvConfig, prefix="env."))
    parser.add_argument("--config", help="YAML file of these options (command-line flags override it)")
    parser.add_argument("--method", help="a registered method: " + ", ".join(_methods()))
    parser.add_argument("--method-option", action="append", metavar="KEY=VALUE", help="e.g. k=3 (repeatable)")
    parser.add_argument("--variant", help="a method's variant or ablation, e.g. seek: parallel_filling, plan, update, "
                                          "no_iter_retrieval, no_initialization; kair: qa_with_docs_only, "
                                          "qa_with_index_only, no_index, no_evolving; maps: no_retrieval_direction, "
                                          "no_parallel, no_disentanglement, single_call (same as --method-option "
                                          "variant=...)")
    parser.add_argument("--budget", choices=PRESETS, help="generation-budget preset: small (the methods' defaults), "
                        "paper (the papers' settings), thinking (reasoning models); --method-option values win")
    parser.add_argument("--greedy", action="store_true",
                        help="greedy decoding under any --budget preset (the default without one); same as "
                             "--method-option temperature=0 top_p=1 top_k=0")
    parser.add_argument("--dataset", help="the dataset's name when --data does not say it (e.g. nq, hotpotqa): "
                                          "--budget paper picks per-dataset search caps by it (default: the --data "
                                          "file or hub name)")
    parser.add_argument("--thinking", choices=tuple(THINKING_MODES), default="auto",
                        help="the chat template's enable_thinking switch: on, off, or auto (the template's default)")
    parser.add_argument("--data", help="FlashRAG JSONL / HotpotQA JSON path, or a Hugging Face dataset name")
    parser.add_argument("--split", default="test", help="split of a hub dataset (default test)")
    parser.add_argument("--limit", type=int, help=f"first N questions (default questions: {DEFAULT_QUESTIONS}); "
                                                  f"rerun with a larger N to extend a run")
    parser.add_argument("--sample", type=int, metavar="N", help="N questions drawn at random with --seed (a larger N "
                                                                "keeps the smaller sample's questions and adds more)")
    parser.add_argument("--llm", help=f"backend:model, e.g. hf:smollm2-135m, vllm:/models/x, openai:gpt-4o-mini "
                                      f"(default {DEFAULT_LLM})")
    parser.add_argument("--llm-option", action="append", metavar="KEY=VALUE",
                        help="backend options, e.g. max_batch_size=8 or base_url=http://127.0.0.1:8000/v1")
    parser.add_argument("--index", help="index directory from scripts/build_index.py (default: embedded)")
    parser.add_argument("--corpus", help="corpus file, when it moved since the index was built")
    parser.add_argument("--retriever", metavar="URL", help="a retrieval server (python -m envs.retrieval.server), e.g. "
                                                           "http://127.0.0.1:8000, instead of --index")
    parser.add_argument("--env-config", help="YAML env recipe over the method's paper limits (see --env)")
    parser.add_argument("--env", action="append", metavar="KEY=VALUE",
                        help="an env setting over the method's paper limits and --env-config, e.g. "
                             "candidates_per_search=3, max_obs_tokens=2400, preview.max_tokens=40 (repeatable); "
                             "or, as in training, --env.KEY VALUE: --env.max_obs_tokens 2400 (every key below)")
    parser.add_argument("--out", help="run folder (predictions.jsonl, metrics.json, config.json, config.yaml)")
    parser.add_argument("--guided-actions", action=argparse.BooleanOptionalAction, default=None,
                        help="constrain each agent turn to free text then one well-formed action of the method's "
                             "format (grammar-guided decoding); default: on for methods with an action format on "
                             "the hf and vllm backends")
    parser.add_argument("--concurrency", type=int, default=32, help="questions in flight at once")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-llm-calls", type=int, default=None,
                        help="per question (default: 64; MAPS: room for all its iterations, e.g. 81 for 10 "
                             "iterations with preview admission)")
    parser.add_argument("--overwrite", action="store_true", help="discard an existing run in --out")
    parser.add_argument("--wandb", action="store_true", help="log to Weights & Biases (offline without a key)")
    parser.add_argument("--wandb-project", default="seeds-rl")
    parser.add_argument("--compare", nargs="+", metavar="RUN",
                        help="print these runs' metrics side by side, then each run against the first: paired "
                             "bootstrap 95%% intervals of the differences (also in compare.json in --out, "
                             "default the first run's folder)")
    parser.add_argument("--shard", metavar="I/N", help="run shard I of N (0-based) of the questions into --out "
                                                       "(under torchrun / accelerate launch: from RANK/WORLD_SIZE)")
    parser.add_argument("--merge", action="store_true", help="merge the shards of --out into predictions.jsonl and "
                                                             "write metrics.json (the last shard to finish does it)")
    return parser


def _methods() -> list[str]:
    return methods.available()


def resolve_args(argv: list[str] | None) -> argparse.Namespace:
    """Command line over ``--config`` YAML over defaults (the TRL recipe convention)."""
    parser = build_parser()
    try:  # training's --env.max_actions 6 is --env max_actions=6 here: one list, read by one reader
        argv = section_pairs(list(sys.argv[1:] if argv is None else argv), "env")
    except ConfigError as err:
        parser.error(str(err))
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
    if isinstance(args.thinking, bool) or args.thinking is None:  # YAML reads `thinking: off` as False
        args.thinking = {True: "on", False: "off", None: "auto"}[args.thinking]
    if args.thinking not in THINKING_MODES:
        parser.error(f"--thinking must be one of {tuple(THINKING_MODES)}, not {args.thinking!r}")
    if args.merge and not args.out:
        parser.error("--merge needs --out")
    if not args.compare and not args.merge and (not args.method or not args.out):
        parser.error("--method and --out are required (or --compare RUN [RUN ...], or --merge --out RUN)")
    return args


NOT_IDENTITY = ("limit", "sample")  # how many questions: a rerun with more extends the run
GREEDY_RECORD = {"mode": "greedy", "temperature": 0.0, "top_p": 1.0, "top_k": 0}  # the decoding before it was an option
ADDED_KEYS = {"guided_actions": False, "sample": None, "sampling": GREEDY_RECORD, "dataset": None}  # keys newer than
# some run folders: their value then


def run_config(args: argparse.Namespace, method, env_config) -> dict:
    """What defines the run: a resumed run must match it, except ``NOT_IDENTITY`` (budget and
    thinking only when set, so runs from before those flags still resume)."""
    return {
        "method": args.method,
        "method_options": method.options(),
        "data": args.data or f"default-questions(seed={args.seed})",
        "split": args.split,
        "limit": args.limit,
        "sample": args.sample,
        "guided_actions": bool(args.guided_actions),
        "llm": args.llm or DEFAULT_LLM,
        "llm_options": parse_options(args.llm_option, "--llm-option"),
        "index": args.retriever or args.index or "default",
        "env": dataclasses.asdict(env_config),
        "seed": args.seed,
        "max_llm_calls": args.max_llm_calls,
        "sampling": method.sampling().record(args.seed),
        **({"dataset": args.dataset} if getattr(args, "dataset", None) else {}),
        **({"budget": args.budget} if args.budget else {}),
        **({"thinking": args.thinking} if args.thinking != "auto" else {}),
    }


def run_identity(config: dict) -> dict:
    """The part of a run's config that a resumed run must match (a greedy run's sampling seed aside:
    greedy decoding does not draw, and ``--seed`` is in the config already)."""
    identity = {**ADDED_KEYS, **config}
    if isinstance(identity["sampling"], dict) and identity["sampling"].get("mode") == "greedy":
        identity["sampling"] = GREEDY_RECORD
    return {k: v for k, v in identity.items() if k not in NOT_IDENTITY}


def seeded_sample(examples: list, n: int, seed: int) -> list:
    """``n`` of ``examples`` drawn at random with ``seed``, in their file order. The draw is a prefix
    of one seeded permutation, so a larger ``n`` keeps every question of a smaller one."""
    if n < 1:
        raise SystemExit(f"--sample must be at least 1, not {n}")
    order = list(range(len(examples)))
    random.Random(seed).shuffle(order)
    return [examples[i] for i in sorted(order[:n])]


def load_examples(args: argparse.Namespace):
    """The run's questions: the first ``--limit``, or ``--sample`` N drawn with ``--seed``."""
    if args.sample is not None and args.limit is not None:
        raise SystemExit("give --limit (the first N questions) or --sample (N at random), not both")
    if args.data:
        examples = load_questions(args.data, split=args.split, limit=args.limit)
        if args.sample is not None:
            examples = seeded_sample(examples, args.sample, args.seed)
    else:  # generated questions are a random draw already
        examples = load_questions(None, limit=args.sample or args.limit or DEFAULT_QUESTIONS, seed=args.seed)
    ids = [e.id for e in examples]
    duplicates = sorted({i for i in ids if ids.count(i) > 1}) if len(set(ids)) != len(ids) else []
    if duplicates:
        raise SystemExit(f"question ids must be unique to resume safely; repeated: {duplicates[:5]}")
    return examples


def load_retriever(args: argparse.Namespace):
    """``--retriever URL`` (a retrieval server), else ``--index`` (a folder or a URL), else the default."""
    return open_run_retriever(args.retriever, args.index, args.corpus)


def prepare_run_dir(out: Path, config: dict, overwrite: bool) -> list[dict]:
    """Create or reopen ``out``; returns the predictions already there (to skip). The run's config
    is checked against ``config.json`` (which old run folders hold alone) and written to it and to
    ``config.yaml`` (:func:`write_run_config`)."""
    out.mkdir(parents=True, exist_ok=True)
    config_path = out / "config.json"
    if overwrite:
        for name in ("predictions.jsonl", "metrics.json", "config.json", "config.yaml"):
            (out / name).unlink(missing_ok=True)
        clear_shards(out)
    elif config_path.exists():
        previous = run_identity(json.loads(config_path.read_text()))
        current = run_identity(json.loads(json.dumps(config)))
        if previous != current:
            changed = sorted(k for k in set(previous) | set(current) if previous.get(k) != current.get(k))
            raise SystemExit(f"{out} holds a run with a different configuration ({', '.join(changed)}); "
                             f"use another --out or --overwrite")
    write_run_config(config, out)
    return load_predictions(out / "predictions.jsonl")


def write_run_config(config: dict, out: Path) -> None:
    """``config.json`` (what a resumed run is checked against, what the readers of run folders read)
    and ``config.yaml``, the same settings as training writes its resolved config."""
    write_json_atomic(config, out / "config.json")
    plain = json.loads(json.dumps(config))  # tuples as lists: safe YAML
    write_text_atomic(yaml.safe_dump(plain, sort_keys=False, allow_unicode=True), out / "config.yaml")


def evaluate(args: argparse.Namespace) -> dict | None:
    """Run (or resume) this process's shard of the questions; the process that completes the run
    merges the shards and returns the metrics (None from the others)."""
    try:
        shard = resolve_shard(args.shard)
    except ValueError as err:
        raise SystemExit(str(err)) from err
    if shard.sharded and args.overwrite:
        raise SystemExit(f"--overwrite with {shard.world} processes would race between them: clear the run once "
                         f"(rm -r {args.out}) or use another --out")
    pin_devices(shard)  # before any engine touches CUDA
    method = build_method(args)
    args.guided_actions = resolve_guided_actions(args, method)
    if args.max_llm_calls is None:
        args.max_llm_calls = method.llm_call_cap()
    base_env = build_env(args, method)
    config = run_config(args, method, base_env)
    out = Path(args.out)
    prepare_run_dir(out, config, args.overwrite)
    examples = load_examples(args)
    ids = [e.id for e in examples]
    own = predictions_file(out, shard)
    done = {r["id"] for r in checked_run_records(out, own, examples)}
    mine = shard.take(examples)
    todo = [e for e in mine if e.id not in done]
    where = f" [shard {shard}]" if shard.sharded else ""
    print(f"{args.method}{where}: {len(mine)} questions, {len(mine) - len(todo)} already done, {len(todo)} to run "
          f"-> {out}", file=sys.stderr)
    write_plan(out, ids, {e.id: question_digest(e.question) for e in examples})
    if todo:
        run_shard(args, config, method, base_env, todo, own, position=shard.local_rank if shard.sharded else None)
    records, missing = merged_records(out, ids)
    if missing:
        print(f"{args.method}{where}: done; {len(missing)} questions are still running in other shards (the last "
              f"process to finish merges; or run --merge --out {out})", file=sys.stderr)
        return None
    return finish_run(args, config, records)


def checked_run_records(out: Path, own: Path | None, examples: list) -> list[dict]:
    """The predictions already in ``out``, after checking that each id still names the question it
    named there (a changed question file would otherwise resume with other questions mixed in)."""
    try:
        records = run_records(out, own)
        check_same_questions(record_digests(records), {e.id: question_digest(e.question) for e in examples},
                             f"the predictions in {out}", "this run's questions")
    except (QuestionMismatchError, PredictionsFileError) as err:
        raise SystemExit(f"{err}; use another --out or --overwrite") from err
    return records


def run_shard(args: argparse.Namespace, config: dict, method, base_env, todo: list, path: Path,
              position: int | None = None) -> None:
    """Run ``todo`` and append their predictions to ``path`` as they finish."""
    try:
        llm = load_backend(args.llm or DEFAULT_LLM, **backend_options(args, config["llm_options"]))
    except ValueError as err:  # a bad spec or setting (e.g. --thinking for a template without the switch)
        raise SystemExit(f"--llm {args.llm or DEFAULT_LLM}: {err}") from err
    retriever = load_retriever(args)
    bar = tqdm(total=len(todo), desc=args.method, unit="q", position=position)
    with PredictionWriter(path, {r["id"] for r in load_predictions(path)}) as writer:
        def on_result(record: dict) -> None:
            writer.write(record)
            bar.update(1)

        run_questions_sync(method, todo, llm, retriever, base_env, concurrency=args.concurrency,
                           seed=args.seed, max_llm_calls=args.max_llm_calls, on_result=on_result,
                           guided_actions=args.guided_actions)
    bar.close()
    llm.close()


def count_unit(config: dict) -> str:
    """What a run's observation caps and ``doc_tokens`` count: ``"tokens"`` of the model's tokenizer
    (the hf and vllm backends; the openai backend with ``--llm-option tokenizer=...``), else
    ``"words"`` (the openai backend without the served model's tokenizer)."""
    kind = str(config.get("llm") or DEFAULT_LLM).partition(":")[0]
    named = (config.get("llm_options") or {}).get("tokenizer")
    return "words" if kind == "openai" and not named else "tokens"


def finish_run(args: argparse.Namespace, config: dict, records: list[dict]) -> dict:
    """``metrics.json`` of the run's records (in question order), the printed table, W&B."""
    metrics = summarize(records)
    metrics["sampling"] = config.get("sampling", GREEDY_RECORD)  # the decoding these figures came from
    metrics["count_unit"] = count_unit(config)  # what observation caps and doc_tokens counted
    write_json_atomic(metrics, Path(args.out) / "metrics.json")
    print(format_table({config["method"]: metrics}))
    if args.wandb:
        log_to_wandb(args, config, metrics, records)
    return metrics


def merged_records(out: Path, ids: list[str]) -> tuple[list[dict], list[str]]:
    """:func:`inference.shards.merge_run`, its refusals (an id naming two questions) as a clear exit."""
    try:
        return merge_run(out, ids)
    except PredictionsFileError as err:
        raise SystemExit(str(err)) from err


def merge(args: argparse.Namespace) -> dict:
    """``--merge``: the run's shards into ``predictions.jsonl`` and its ``metrics.json``."""
    out = Path(args.out)
    try:
        ids = read_plan(out)
    except FileNotFoundError as err:
        raise SystemExit(str(err)) from err
    records, missing = merged_records(out, ids)
    if missing:
        raise SystemExit(f"{out}: {len(missing)} of {len(ids)} questions have no prediction yet (e.g. {missing[:3]}); "
                         "run the launch again (it resumes) before merging")
    return finish_run(args, json.loads((out / "config.json").read_text()), records)


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
        elif (Path(run) / "predictions.jsonl").exists() or shard_files(Path(run)):  # unfinished: what is there
            rows[Path(run).name] = summarize(run_records(Path(run)))
        else:
            raise SystemExit(f"{run}: no metrics.json or predictions.jsonl")
    return format_table(rows)


def compare_paired(runs: list[str], out: str | None) -> str:
    """The paired bootstrap of every run against the first, written to ``compare.json`` in ``out``
    (default: the first run's folder)."""
    try:
        comparison = compare_runs(runs)
    except QuestionMismatchError as err:
        raise SystemExit(f"--compare: {err}; these runs cannot be paired by id") from err
    except CompareError as err:
        return f"no paired comparison: {err}"
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
    if args.merge:
        merge(args)
        return 0
    evaluate(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
