"""Evaluate a method in the search environment.

    python -m inference.evaluate --method.name seeds-react --data.path data/hotpot.jsonl --data.limit 500 \\
        --model.name hf:/models/qwen --data.index indexes/wiki18-e5 --run.output_dir runs/seeds-react-hotpot
    python -m inference.evaluate --method.name vanilla-rag --data.limit 20 --run.output_dir runs/rag  # embedded default
    python -m inference.evaluate --config configs/eval/seeds_react_default.yaml --env.max_actions 6
    python -m inference.evaluate --compare runs/rag runs/seeds-react   # paired bootstrap -> runs/rag/compare.json
    accelerate launch --multi_gpu --num_processes 8 -m inference.evaluate ...   # data-parallel: one engine per GPU

Settings are one typed tree (:mod:`inference.eval_config`): ``--section.field value`` over a
``--config`` YAML over the defaults, as in training (``--env.max_actions 6``,
``--env.reward.positive_opened_bonus 0.2``, ``--method.options.max_tokens 128``). Without
``data.path``, ``model.name`` and ``data.index`` it runs on the embedded default: questions generated
from the Wikipedia-summaries corpus, SmolLM2-135M-Instruct (hf backend) and the default MiniLM index
(built on first use). Agent turns are guided to the method's action format on the hf and vllm
backends unless ``--model.guided_actions false``. Predictions are appended to
``<run.output_dir>/predictions.jsonl`` as they finish, so a killed run resumes where it stopped;
``metrics.json``, ``config.json`` and ``config.yaml`` (the same record) sit beside (old run folders
with ``config.json`` alone still resume, merge and compare). Under a launcher (or with
``--run.shard i/n``) each process runs its shard of the questions into the same folder
(:mod:`inference.shards`). Actions: ``--compare RUN [RUN ...]`` prints runs side by side and pairs
each with the first (``--run.output_dir``: where compare.json goes); ``--merge`` merges the shards
of ``--run.output_dir``.
"""
from __future__ import annotations

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
from envs.data import load_questions
from envs.question_match import QuestionMismatchError, check_same_questions, question_digest, record_digests
from envs.report import with_current_names
from envs.retrieval.defaults import open_run_retriever
from envs.typed_config import help_text
from inference.backends import load_backend
from inference.compare import CompareError, compare_runs, format_comparison
from inference.eval_config import DEFAULT_LLM, Actions, DataSettings, EvalConfig, RunSettings, config_or_exit
from inference.predictions import PredictionsFileError, PredictionWriter, load_predictions
from inference.run_metrics import format_table, summarize
from inference.run_setup import backend_options, build_env, build_method, resolve_guided_actions
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
from methods.runner import run_questions_sync

DEFAULT_QUESTIONS = 100


def usage() -> str:
    """``--help``: this module's docstring, the registered methods, every field of the config."""
    return (f"usage: python -m inference.evaluate [--config recipe.yaml] [--section.field value ...] "
            f"[--compare RUN ...] [--merge]\n{__doc__}\nmethods: {', '.join(methods.available())}\n\n"
            f"{help_text(EvalConfig)}")


def resolve_args(argv: list[str] | None) -> EvalConfig:
    """The run's config from a command line without actions (:func:`resolve_command` takes those)."""
    actions, cfg = resolve_command(argv)
    if actions.compare or actions.merge:
        raise SystemExit("--compare and --merge are actions: run them through main()")
    return cfg


def resolve_command(argv: list[str] | None) -> tuple[Actions, EvalConfig]:
    """The actions and the config of a command line: defaults < ``--config`` YAML < ``--section.field``
    (the TRL recipe convention; :func:`inference.eval_config.config_or_exit`), checked for what a run needs."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if "-h" in argv or "--help" in argv:
        print(usage())
        raise SystemExit(0)
    actions, cfg = config_or_exit(argv)
    if actions.merge and not cfg.run.output_dir:
        raise SystemExit("--merge needs --run.output_dir")
    if not actions.compare and not actions.merge and (not cfg.method.name or not cfg.run.output_dir):
        raise SystemExit("--method.name and --run.output_dir are required (or --compare RUN [RUN ...], or --merge "
                         "--run.output_dir RUN); --help lists every option")
    return actions, cfg


NOT_IDENTITY = ("limit", "sample")  # how many questions: a rerun with more extends the run
GREEDY_RECORD = {"mode": "greedy", "temperature": 0.0, "top_p": 1.0, "top_k": 0}  # the decoding before it was an option
ADDED_KEYS = {"guided_actions": False, "sample": None, "sampling": GREEDY_RECORD, "dataset": None}  # keys newer than
# some run folders: their value then


def run_config(cfg: EvalConfig, method, env_config) -> dict:
    """What defines the run: a resumed run must match it, except ``NOT_IDENTITY`` (budget and
    thinking only when set, so runs from before those settings still resume). The record's keys
    are those of every earlier version (``llm``, ``index``, ...), so old run folders resume."""
    data, seed = cfg.data, cfg.run.seed
    return {
        "method": cfg.method.name,
        "method_options": method.options(),
        "data": data.path or f"default-questions(seed={seed})",
        "split": data.split,
        "limit": data.limit,
        "sample": data.sample,
        "guided_actions": bool(cfg.model.guided_actions),
        "llm": cfg.model.name,
        "llm_options": dict(cfg.model.options),
        "index": data.retriever or data.index or "default",
        "env": dataclasses.asdict(env_config),
        "seed": seed,
        "max_llm_calls": cfg.method.max_llm_calls,
        "sampling": method.sampling().record(seed),
        **({"dataset": data.dataset} if data.dataset else {}),
        **({"budget": cfg.method.budget} if cfg.method.budget else {}),
        **({"thinking": cfg.model.thinking} if cfg.model.thinking != "auto" else {}),
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
        raise SystemExit(f"data.sample must be at least 1, not {n}")
    order = list(range(len(examples)))
    random.Random(seed).shuffle(order)
    return [examples[i] for i in sorted(order[:n])]


def load_examples(data: DataSettings, seed: int):
    """The run's questions: the first ``data.limit``, or ``data.sample`` N drawn with ``seed``."""
    if data.sample is not None and data.limit is not None:
        raise SystemExit("give data.limit (the first N questions) or data.sample (N at random), not both")
    if data.path:
        examples = load_questions(data.path, split=data.split, limit=data.limit)
        if data.sample is not None:
            examples = seeded_sample(examples, data.sample, seed)
    else:  # generated questions are a random draw already
        examples = load_questions(None, limit=data.sample or data.limit or DEFAULT_QUESTIONS, seed=seed)
    ids = [e.id for e in examples]
    duplicates = sorted({i for i in ids if ids.count(i) > 1}) if len(set(ids)) != len(ids) else []
    if duplicates:
        raise SystemExit(f"question ids must be unique to resume safely; repeated: {duplicates[:5]}")
    return examples


def load_retriever(data: DataSettings):
    """``data.retriever`` (a retrieval server or web search), else ``data.index`` (a folder or a URL),
    else the default."""
    return open_run_retriever(data.retriever, data.index, data.corpus)


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
                             f"use another --run.output_dir or --run.overwrite true")
    write_run_config(config, out)
    return load_predictions(out / "predictions.jsonl")


def write_run_config(config: dict, out: Path) -> None:
    """``config.json`` (what a resumed run is checked against, what the readers of run folders read)
    and ``config.yaml``, the same settings as training writes its resolved config."""
    write_json_atomic(config, out / "config.json")
    plain = json.loads(json.dumps(config))  # tuples as lists: safe YAML
    write_text_atomic(yaml.safe_dump(plain, sort_keys=False, allow_unicode=True), out / "config.yaml")


def resolved(cfg: EvalConfig, method) -> EvalConfig:
    """``cfg`` with what the method decides when the config leaves it open: guided actions and the
    cap on LLM calls per question."""
    guided = resolve_guided_actions(cfg.model, cfg.method.budget, method)
    calls = method.llm_call_cap() if cfg.method.max_llm_calls is None else cfg.method.max_llm_calls
    return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, guided_actions=guided),
                               method=dataclasses.replace(cfg.method, max_llm_calls=calls))


def evaluate(cfg: EvalConfig) -> dict | None:
    """Run (or resume) this process's shard of the questions; the process that completes the run
    merges the shards and returns the metrics (None from the others)."""
    run = cfg.run
    try:
        shard = resolve_shard(run.shard)
    except ValueError as err:
        raise SystemExit(str(err)) from err
    if shard.sharded and run.overwrite:
        raise SystemExit(f"run.overwrite with {shard.world} processes would race between them: clear the run once "
                         f"(rm -r {run.output_dir}) or use another run.output_dir")
    pin_devices(shard)  # before any engine touches CUDA
    method = build_method(cfg.method)
    cfg = resolved(cfg, method)
    base_env = build_env(cfg, method)
    config = run_config(cfg, method, base_env)
    out = Path(str(run.output_dir))
    prepare_run_dir(out, config, run.overwrite)
    examples = load_examples(cfg.data, run.seed)
    ids = [e.id for e in examples]
    own = predictions_file(out, shard)
    done = {r["id"] for r in checked_run_records(out, own, examples)}
    mine = shard.take(examples)
    todo = [e for e in mine if e.id not in done]
    where = f" [shard {shard}]" if shard.sharded else ""
    name = cfg.method.name
    print(f"{name}{where}: {len(mine)} questions, {len(mine) - len(todo)} already done, {len(todo)} to run "
          f"-> {out}", file=sys.stderr)
    write_plan(out, ids, {e.id: question_digest(e.question) for e in examples})
    if todo:
        run_shard(cfg, config, method, base_env, todo, own, position=shard.local_rank if shard.sharded else None)
    records, missing = merged_records(out, ids)
    if missing:
        print(f"{name}{where}: done; {len(missing)} questions are still running in other shards (the last "
              f"process to finish merges; or run --merge --run.output_dir {out})", file=sys.stderr)
        return None
    return finish_run(run, config, records)


def checked_run_records(out: Path, own: Path | None, examples: list) -> list[dict]:
    """The predictions already in ``out``, after checking that each id still names the question it
    named there (a changed question file would otherwise resume with other questions mixed in)."""
    try:
        records = run_records(out, own)
        check_same_questions(record_digests(records), {e.id: question_digest(e.question) for e in examples},
                             f"the predictions in {out}", "this run's questions")
    except (QuestionMismatchError, PredictionsFileError) as err:
        raise SystemExit(f"{err}; use another --run.output_dir or --run.overwrite true") from err
    return records


def run_shard(cfg: EvalConfig, config: dict, method, base_env, todo: list, path: Path,
              position: int | None = None) -> None:
    """Run ``todo`` and append their predictions to ``path`` as they finish."""
    try:
        llm = load_backend(cfg.model.name, **backend_options(cfg.model, cfg.run.concurrency))
    except ValueError as err:  # a bad spec or setting (e.g. thinking for a template without the switch)
        raise SystemExit(f"model.name {cfg.model.name}: {err}") from err
    retriever = load_retriever(cfg.data)
    bar = tqdm(total=len(todo), desc=cfg.method.name, unit="q", position=position)
    with PredictionWriter(path, {r["id"] for r in load_predictions(path)}) as writer:
        def on_result(record: dict) -> None:
            writer.write(record)
            bar.update(1)

        run_questions_sync(method, todo, llm, retriever, base_env, concurrency=cfg.run.concurrency,
                           seed=cfg.run.seed, max_llm_calls=cfg.method.max_llm_calls, on_result=on_result,
                           guided_actions=bool(cfg.model.guided_actions))
    bar.close()
    llm.close()


def count_unit(config: dict) -> str:
    """What a run's observation caps and ``doc_tokens`` count: ``"tokens"`` of the model's tokenizer
    (the hf and vllm backends; the openai backend with ``--llm-option tokenizer=...``), else
    ``"words"`` (the openai backend without the served model's tokenizer)."""
    kind = str(config.get("llm") or DEFAULT_LLM).partition(":")[0]
    named = (config.get("llm_options") or {}).get("tokenizer")
    return "words" if kind == "openai" and not named else "tokens"


def finish_run(run: RunSettings, config: dict, records: list[dict]) -> dict:
    """``metrics.json`` of the run's records (in question order), the printed table, W&B."""
    metrics = summarize(records)
    metrics["sampling"] = config.get("sampling", GREEDY_RECORD)  # the decoding these figures came from
    metrics["count_unit"] = count_unit(config)  # what observation caps and doc_tokens counted
    write_json_atomic(metrics, Path(str(run.output_dir)) / "metrics.json")
    print(format_table({config["method"]: metrics}))
    if run.report_to == "wandb":
        log_to_wandb(run, config, metrics, records)
    return metrics


def merged_records(out: Path, ids: list[str]) -> tuple[list[dict], list[str]]:
    """:func:`inference.shards.merge_run`, its refusals (an id naming two questions) as a clear exit."""
    try:
        return merge_run(out, ids)
    except PredictionsFileError as err:
        raise SystemExit(str(err)) from err


def merge(run: RunSettings) -> dict:
    """``--merge``: the run's shards into ``predictions.jsonl`` and its ``metrics.json``."""
    out = Path(str(run.output_dir))
    try:
        ids = read_plan(out)
    except FileNotFoundError as err:
        raise SystemExit(str(err)) from err
    records, missing = merged_records(out, ids)
    if missing:
        raise SystemExit(f"{out}: {len(missing)} of {len(ids)} questions have no prediction yet (e.g. {missing[:3]}); "
                         "run the launch again (it resumes) before merging")
    return finish_run(run, json.loads((out / "config.json").read_text()), records)


def log_to_wandb(settings: RunSettings, config: dict, metrics: dict, records: list[dict]) -> None:
    try:
        import wandb
    except ImportError as err:
        raise SystemExit("run.report_to wandb needs the wandb package: pip install wandb") from err
    mode = "online" if os.environ.get("WANDB_API_KEY") else "offline"
    out = Path(str(settings.output_dir))
    run = wandb.init(project=settings.wandb_project, name=out.name, config=config, mode=mode, dir=str(out))
    run.summary.update({k: v for k, v in metrics.items() if isinstance(v, (int, float))})
    table = wandb.Table(columns=["id", "question", "prediction", "golden_answers", "em", "searches", "docs_read"])
    for r in records[:500]:
        table.add_data(r["id"], r["question"], r["prediction"], ", ".join(r["golden_answers"]), r["metrics"]["em"],
                       r["n_searches"], r["docs_read"])
    run.log({"predictions": table})
    run.finish()
    if mode == "offline":
        print(f"W&B: no WANDB_API_KEY, logged offline under {out / 'wandb'}; upload with `wandb sync`",
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
    actions, cfg = resolve_command(argv)
    if actions.compare:
        print(compare(actions.compare))
        if len(actions.compare) > 1:
            print("\n" + compare_paired(actions.compare, cfg.run.output_dir))
        return 0
    if actions.merge:
        merge(cfg.run)
        return 0
    evaluate(cfg)
    return 0


if __name__ == "__main__":
    sys.exit(main())
