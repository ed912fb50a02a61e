"""The text protocol between a policy and the environment.

Actions are ``<search>query</search>``, ``<expand>2, 5</expand>`` (1-based candidate numbers
from the latest snapshot, separated by commas or spaces, or ``none``) and
``<answer>text</answer>``. The expand action also has a judgement form,
``<expand>[1] no [2] yes [3] no</expand>``: one yes/no per candidate, the yes ones are opened
(``EnvConfig.expand_form = "judge"`` requires it and a judgement for every candidate shown). \
The first complete action tag in the model output is the action;
text before it (reasoning, ``<think>`` blocks) is allowed and ignored. Anything else parses
to an :class:`InvalidAction` carrying the reason, never an exception.
"""
from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

ACTION_TAGS = ("search", "expand", "answer")
CLOSING_TAGS = tuple(f"</{tag}>" for tag in ACTION_TAGS)
_ACTION = re.compile(r"<(search|expand|answer)>(.*?)</\1>", re.DOTALL | re.IGNORECASE)
_OPEN_ONLY = re.compile(r"<(search|expand|answer)>", re.IGNORECASE)
_ID_SEPARATORS = re.compile(r"[\s,;]+")
_JUDGEMENT = re.compile(r"\[?(\d+)\]?\s*[:=\-]?\s*([^\s\[\],;]+)")
_JUDGEMENT_BODY = re.compile(r"^(?:[\s,;.]*\[\d+\]\s*[:=\-]?\s*[^\s\[\],;]+)+[\s,;.]*$|"
                             r"^(?:[\s,;.]*\d+\s*[:=\-]?\s*(?:yes|no)\b)+[\s,;.]*$", re.IGNORECASE)
_VERDICTS = {"yes": True, "no": False}
EXPAND_FORMS = ("list", "judge")
# where the judgement form's verdicts are made: "stream" interleaved in the episode's token stream,
# "alone" each candidate in a short context of its own (judge_alone_prompts)
JUDGE_CONTEXTS = ("stream", "alone")
_SNAPSHOT_LINE = re.compile(r"^\[(\d+)\] ", re.MULTILINE)


@dataclass(frozen=True)
class JudgeForm:
    """How a policy says which candidates to open, chosen once from the env config
    (:func:`judge_form`, ``EnvConfig.judge_form``) and asked, never re-derived from the two mode
    strings: :data:`LIST_FORM` (one ``<expand>`` naming ids), :data:`STREAM_FORM` (one verdict token
    per candidate, interleaved in the episode's own token stream) or :data:`ALONE_FORM` (one verdict
    per candidate in a short context of its own; the stream shows the snapshot and the expand they make)."""
    name: str  # "list" | "stream" | "alone"
    judged: bool  # one verdict token per candidate (expand_form: judge)
    alone: bool  # the verdicts are made outside the episode's stream (judge_context: alone)

    @property
    def in_stream(self) -> bool:
        """Verdicts interleaved in the episode's stream: the snapshot is laid out candidate by candidate."""
        return self.judged and not self.alone


LIST_FORM = JudgeForm("list", judged=False, alone=False)
STREAM_FORM = JudgeForm("stream", judged=True, alone=False)
ALONE_FORM = JudgeForm("alone", judged=True, alone=True)
_FORMS = {("list", "stream"): LIST_FORM, ("judge", "stream"): STREAM_FORM, ("judge", "alone"): ALONE_FORM}


def judge_form(expand_form: str = "list", judge_context: str = "stream") -> JudgeForm:
    """The :class:`JudgeForm` of an env's ``expand_form`` and ``judge_context``; a combination that
    is none of the three raises ``ValueError`` with the reason."""
    if expand_form not in EXPAND_FORMS:
        raise ValueError(f"expand_form must be one of {EXPAND_FORMS}, not {expand_form!r}")
    if judge_context not in JUDGE_CONTEXTS:
        raise ValueError(f"judge_context must be one of {JUDGE_CONTEXTS}, not {judge_context!r}")
    form = _FORMS.get((expand_form, judge_context))
    if form is None:
        raise ValueError(f"judge_context {judge_context!r} needs expand_form: judge")
    return form


@dataclass(frozen=True)
class SearchAction:
    query: str


@dataclass(frozen=True)
class ExpandAction:
    ids: tuple[int, ...]  # 1-based candidate numbers, in the order given, without repeats
    judged: tuple[int, ...] | None = None  # judgement form: every candidate judged, in order; None: list form


@dataclass(frozen=True)
class AnswerAction:
    answer: str


@dataclass(frozen=True)
class InvalidAction:
    reason: str
    raw: str


Action = SearchAction | ExpandAction | AnswerAction | InvalidAction


def _parse_judgements(body: str, raw: str) -> Action:
    """``[1] no [2] yes ...`` -> the yes ones as ids, every judged number in ``judged``."""
    judged: list[int] = []
    opened: list[int] = []
    for number, verdict in _JUDGEMENT.findall(body):
        value = int(number)
        if value in judged:
            return InvalidAction(f"candidate {value} is judged twice", raw)
        if verdict.lower().strip(".!") not in _VERDICTS:
            return InvalidAction(f"candidate {value} must be judged yes or no, not {verdict!r}", raw)
        judged.append(value)
        if _VERDICTS[verdict.lower().strip(".!")]:
            opened.append(value)
    return ExpandAction(ids=tuple(opened), judged=tuple(judged))


def _parse_ids(body: str, raw: str) -> Action:
    if _JUDGEMENT_BODY.match(body):
        return _parse_judgements(body, raw)
    cleaned = body.strip().strip("[]").strip()
    if cleaned.lower() in {"none", "no", "nothing"}:
        return ExpandAction(ids=())
    if not cleaned:
        return InvalidAction("empty <expand>; give candidate numbers such as 1, 3 or the word none", raw)
    ids: list[int] = []
    for token in _ID_SEPARATORS.split(cleaned):
        token = token.strip("[]()#")
        if not token:
            continue
        if not token.isdigit():
            return InvalidAction(f"expand id {token!r} is not a candidate number", raw)
        value = int(token)
        if value not in ids:
            ids.append(value)
    return ExpandAction(ids=tuple(ids))


def parse_action(text: str) -> Action:
    """Parse one model turn into a typed action (or an invalid one with a reason)."""
    match = _ACTION.search(text)
    if match is None:
        opened = _OPEN_ONLY.search(text)
        if opened:
            return InvalidAction(f"<{opened.group(1).lower()}> is never closed", text)
        return InvalidAction("no <search>, <expand> or <answer> action found", text)
    tag, body = match.group(1).lower(), match.group(2)
    if tag == "search":
        query = " ".join(body.split())
        return SearchAction(query) if query else InvalidAction("empty <search> query", text)
    if tag == "expand":
        return _parse_ids(body, text)
    answer = " ".join(body.split())
    return AnswerAction(answer) if answer else InvalidAction("empty <answer>", text)


def format_search(query: str) -> str:
    return f"<search>{query}</search>"


def format_expand(ids: list[int] | tuple[int, ...], n_candidates: int | None = None, form: str = "list") -> str:
    """``<expand>`` opening ``ids``: a list (``2, 5`` or ``none``), or with ``form="judge"`` one
    judgement per candidate 1..``n_candidates`` (``[1] no [2] yes ...``)."""
    if form not in EXPAND_FORMS:
        raise ValueError(f"expand form must be one of {EXPAND_FORMS}, not {form!r}")
    if form == "list":
        return f"<expand>{', '.join(str(i) for i in ids) if ids else 'none'}</expand>"
    if n_candidates is None:
        raise ValueError("the judgement form needs the number of candidates shown")
    chosen = set(ids)
    if not chosen <= set(range(1, n_candidates + 1)):
        raise ValueError(f"ids {sorted(chosen)} are not all candidates of 1..{n_candidates}")
    return "<expand>" + " ".join(
        f"[{i}] {'yes' if i in chosen else 'no'}" for i in range(1, n_candidates + 1)
    ) + "</expand>"


def judgement_action(words: list[str]) -> str:
    """The ``<expand>`` action of per-candidate judgement words in order (``[" yes", " no"]`` ->
    ``<expand>[1] yes [2] no</expand>``); a word other than yes/no stays, so the env refuses it."""
    return "<expand>" + " ".join(f"[{i}] {w.strip() or '?'}" for i, w in enumerate(words, start=1)) + "</expand>"


# Interleaved rendering of a snapshot for the judgement form (SEEDS-R1 with expand_form: judge):
# in the policy's token stream each candidate is followed by its question and the policy's one-token
# verdict, so the decision sits right after the preview it is about. Rollouts, evaluation and SFT
# all render it with these two functions.
JUDGE_WORDS = (" yes", " no")  # the verdict tokens (index 0 = open)
JUDGE_QUESTION = "\nRead [{number}]?"
JUDGE_QUESTION_RESTATED = "\nDoes [{number}] help answer: {question}?"  # EnvConfig.judge_question
SNAPSHOT_QUESTION = "Question: "  # the line a snapshot starts with under EnvConfig.judge_question


def judge_token_ids(tokenizer) -> tuple[int, ...]:
    """The token ids of :data:`JUDGE_WORDS` (open first) for a policy's tokenizer: the choices a
    constrained verdict picks from. Raises ValueError when a word is not exactly one token."""
    ids = []
    for word in JUDGE_WORDS:
        pieces = list(tokenizer(word, add_special_tokens=False)["input_ids"])
        if len(pieces) != 1:
            raise ValueError(f"the verdict {word!r} is {len(pieces)} tokens for this tokenizer, not one: "
                             "constrained verdicts need single-token verdict words (constrain_verdicts: false "
                             "samples the verdict freely)")
        ids.append(int(pieces[0]))
    if len(set(ids)) != len(ids):
        raise ValueError(f"the verdict words {JUDGE_WORDS!r} share a token id for this tokenizer")
    return tuple(ids)


# How greedy decoding turns the verdicts of one snapshot, each judged alone, into opens: "level" each on
# its own (the verdict drawn, π(yes) > 0.5: what a shared drift of the yes level moves), "snapshot_mean"
# the candidates whose π(yes) lies above the mean of their snapshot's (what the ranking alone decides)
VERDICT_CUTS = ("level", "snapshot_mean")


def yes_prob(logprob: float, said_yes: bool) -> float:
    """π(yes) of a two-way (constrained) verdict from the log-prob of the choice it made."""
    p = math.exp(logprob)
    return p if said_yes else 1.0 - p


def cut_verdicts(yes_probs: Sequence[float], drawn: Sequence[bool], cut: str) -> list[bool]:
    """Which candidates of one snapshot are opened, from their π(yes) (N,) and the verdicts greedy
    decoding drew (N,), under ``cut`` (:data:`VERDICT_CUTS`): ``level`` keeps the drawn verdicts;
    ``snapshot_mean`` opens those strictly above the snapshot's mean π(yes), and keeps the drawn ones
    where the candidates cannot be told apart (one candidate, or all within 1e-6 of each other)."""
    if cut not in VERDICT_CUTS:
        raise ValueError(f"unknown verdict cut {cut!r} (one of {', '.join(VERDICT_CUTS)})")
    probs = [float(p) for p in yes_probs]
    if len(probs) != len(drawn):
        raise ValueError(f"{len(probs)} π(yes) for {len(drawn)} verdicts")
    if cut == "level" or not probs or max(probs) - min(probs) <= 1e-6:
        return [bool(v) for v in drawn]
    mean = sum(probs) / len(probs)
    return [p > mean for p in probs]


def snapshot_candidates(observation: str) -> list[str]:
    """The candidate lines of a ``<snapshot>`` observation, in order, each without its ``[i] ``.

    A candidate whose text holds line breaks stays whole: a new one starts only at a line ``[n] ``
    with the next expected number. Not a snapshot, or no candidates: ``[]``.
    """
    body = observation.strip()
    if not body.startswith("<snapshot>"):
        return []
    body = body.removeprefix("<snapshot>").removesuffix("</snapshot>").strip()
    lines: list[str] = []
    start = None
    for match in _SNAPSHOT_LINE.finditer(body):
        if int(match.group(1)) != len(lines) + (start is not None) + 1:
            continue
        if start is not None:
            lines.append(body[start:match.start()].strip())
        start = match.end()
    if start is not None:
        lines.append(body[start:].strip())
    return lines


def snapshot_question(observation: str) -> str | None:
    """The question a snapshot restates on its first line (``EnvConfig.judge_question``), or None."""
    body = observation.strip().removeprefix("<snapshot>").lstrip("\n")
    if not observation.strip().startswith("<snapshot>") or not body.startswith(SNAPSHOT_QUESTION):
        return None
    return body.split("\n", 1)[0].removeprefix(SNAPSHOT_QUESTION).strip()


def judge_chunks(observation: str) -> tuple[list[str], str]:
    """Text around the verdicts of a snapshot: chunk i shows candidate i and asks about it (a verdict
    token follows each chunk); then the closing text. ``([], "")`` when nothing is to be judged.

    Concatenated with the verdicts the chunks read ``\n<snapshot>\n[1] Title: preview\nRead [1]? yes``
    ``\n[2] ...\nRead [2]? no`` ... ``\n</snapshot>\n``. A snapshot that starts with a
    ``Question: q`` line (``EnvConfig.judge_question``) asks ``Does [i] help answer: q?`` instead.
    """
    lines = snapshot_candidates(observation)
    question = snapshot_question(observation)
    asks = [JUDGE_QUESTION.format(number=i) if question is None
            else JUDGE_QUESTION_RESTATED.format(number=i, question=question.rstrip("?"))
            for i in range(1, len(lines) + 1)]
    chunks = [("\n<snapshot>" if i == 1 else "") + f"\n[{i}] {line}" + ask
              for i, (line, ask) in enumerate(zip(lines, asks), start=1)]
    return chunks, ("\n</snapshot>\n" if chunks else "")


# The judgement form with judge_context "alone": each candidate is judged in a short context of its
# own (the candidate, then the question), outside the episode's token stream, so the question sits
# right next to the one preview it is about and a verdict costs a short prefill. Rollouts and
# evaluation build these contexts with judge_alone_prompts; the verdict token follows "Answer:".
JUDGE_ALONE = "{candidate}\nQuestion: {question}\nDoes this passage help answer the question? Answer:"


def judge_alone_prompts(question: str, observation: str) -> list[str]:
    """One short judgement context per candidate of a snapshot (``[]`` when nothing is to be
    judged): :data:`JUDGE_ALONE` with the candidate's line (title and preview) and the question."""
    return [JUDGE_ALONE.format(candidate=line, question=question.strip())
            for line in snapshot_candidates(observation)]


def format_answer(answer: str) -> str:
    return f"<answer>{answer}</answer>"


def format_snapshot(body: str) -> str:
    """``<snapshot>`` observation around ``[i] Title: preview`` lines (see :func:`snapshot_lines`)."""
    return f"<snapshot>\n{body}\n</snapshot>"


def snapshot_lines(previews: list[str]) -> str:
    return "\n".join(f"[{i}] {p}" for i, p in enumerate(previews, start=1))


def format_passage(number: int, title: str, text: str) -> str:
    return f"[{number}] {title}\n{text}" if title else f"[{number}] {text}"


def format_information(body: str) -> str:
    return f"<information>\n{body}\n</information>"


def format_invalid(reason: str) -> str:
    """Observation for a bad action: what was wrong, so the policy can recover."""
    return format_information(f"Invalid action: {reason}.")
