"""The scripted SFT teacher: plays SEEDS-R1 episodes and answers from what it READ, never the gold.

- **Queries.** The first query is written from the question by a named rule (:data:`QUERY_RULES`):
  ``"question"``, the question itself; ``"quoted"``, the question's quoted clues (the text between
  double quotes, masks ``___`` dropped) joined, or the question where it quotes nothing. A later
  query is only ever text the teacher was shown: the title (as the snapshot shows it) of a candidate it did not open. It
  searches again (``second_search``) only when no passage it opened shares a content word with
  the question, picking the unopened candidate whose snapshot line shares the most, and only
  while a search, its expand and the answer still fit the env's action budget.
- **Expansion** (``expand``): ``"random"`` (the default) opens ``random_expand`` random candidates
  of each snapshot, or each candidate with probability ``open_rate``: it teaches the protocol, not
  which candidates to open (left to PPO). ``"positives"`` is GOLD-GUIDED: it opens the candidates
  labelled positive for the question (plus ``extra_expand`` random others); use it only to study
  what gold expansions do. ``"labels"`` is a NOISY LABEL-INFORMED teacher for warm starts: each
  candidate labelled positive is opened with probability ``positive_open_rate``, each other one with
  ``negative_open_rate``; SFT on its verdicts teaches P(yes | preview) = P(positive | preview)·(p⁺ − p⁻)
  + p⁻, a ranking wherever the previews tell positives apart and the level p⁻ + base·(p⁺ − p⁻) where
  they do not (the training questions' labels choose; the policy only ever sees the previews).
- **Answer** by a named reader rule over the passages it opened (:data:`READER_RULES`);
  ``"first_title"``: the title of the first passage of the last ``<information>`` observation
  that showed passages (the default corpus's answers are article titles), ``"unknown"`` when
  nothing was opened; ``"overlap_title"``: the title of the passage of that reading sharing the
  most content words with the question.

Every expand is written with :func:`envs.protocol.format_expand` in the env's ``expand_form``.
The E.2 filter (:func:`training.teachers.trajectories.acceptance`) then keeps an episode only when its
answer is exactly right or a gold answer appeared in an observation, so it rejects episodes.
"""
from __future__ import annotations

import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from envs.config import EnvConfig
from envs.metrics import normalize_answer
from envs.protocol import format_answer, format_expand, format_search
from envs.types import QAExample
from envs.vector_env import SearchVectorEnv
from training.teachers.trajectories import make_record, seeds_r1_prompt

TEACHER_EXPAND_MODES = ("random", "positives", "labels")  # "positives" is gold-guided, "labels" noisily so
UNKNOWN_ANSWER = "unknown"
THINK_TEXTS = {
    "search": "I need facts I do not have yet, so I will search for them.",
    "expand": "Candidates {ids} look worth reading in full.",
    "expand_none": "None of these candidates looks useful.",
    "search_again": "The passages I read do not touch the question; I will search for {query} instead.",
    "answer": "I answer with what the passages I read say.",
    "answer_unknown": "I read nothing that answers it.",
}
_STOPWORDS = frozenset(
    "a an the of and or in on at to for by with from is are was were be been it its this that which who whom "
    "whose what when where why how as into than then also not no".split())
_NUMBERED = re.compile(r"^\[(\d+)\] ?", re.MULTILINE)


@dataclass(frozen=True)
class OpenedPassage:
    """A passage as an ``<information>`` observation showed it (``text`` cut where the env cut it;
    empty for a passage marked "already read above")."""

    number: int
    title: str
    text: str


@dataclass(frozen=True)
class ShownCandidate:
    """A snapshot candidate: its title as the snapshot shows it and its whole snapshot line."""

    number: int
    title: str
    line: str


ReaderRule = Callable[[str, Sequence[Sequence[OpenedPassage]]], str]


def first_title_reader(question: str, readings: Sequence[Sequence[OpenedPassage]]) -> str:
    """The title of the first passage (with a title) of the last reading that showed passages."""
    for reading in reversed(readings):
        for passage in reading:
            if passage.title.strip():
                return passage.title.strip()
    return UNKNOWN_ANSWER


def overlap_title_reader(question: str, readings: Sequence[Sequence[OpenedPassage]]) -> str:
    """The title of the passage of the last reading that showed passages whose text shares the
    most content words with the question (the earlier one on a tie)."""
    asked = content_words(question)
    for reading in reversed(readings):
        titled = [p for p in reading if p.title.strip()]
        if titled:
            best = max(titled, key=lambda p: (len(asked & content_words(p.text)), -titled.index(p)))
            return best.title.strip()
    return UNKNOWN_ANSWER


READER_RULES: dict[str, ReaderRule] = {"first_title": first_title_reader, "overlap_title": overlap_title_reader}
_QUOTED = re.compile(r'"([^"]+)"')
_MASKS = re.compile(r"\s*_{2,}\s*")


def quoted_query(question: str) -> str:
    """The question's quoted clues, masks dropped, joined by "; " (the question when it quotes
    nothing): a query that is not a copy of the question's template words."""
    clues = [" ".join(_MASKS.sub(" ", clue).split()) for clue in _QUOTED.findall(question)]
    clues = [clue for clue in clues if clue]
    return "; ".join(clues) if clues else question


QUERY_RULES: dict[str, Callable[[str], str]] = {"question": lambda question: question, "quoted": quoted_query}


@dataclass(frozen=True)
class ScriptedTeacherConfig:
    expand: str = "random"  # "random" or the gold-guided "positives"
    extra_expand: int = 0  # positives mode: random non-positives opened as well
    random_expand: int = 2  # random mode: candidates opened per snapshot
    # random mode: open each candidate independently with this probability instead (None: random_expand of them);
    # with the judgement form judged alone and SFT on the verdicts, it is the warm start's yes rate
    open_rate: float | None = None
    # labels mode: the probability of opening a candidate labelled positive, and one labelled negative
    positive_open_rate: float = 0.95
    negative_open_rate: float = 0.5
    second_search: bool = True  # search a shown candidate's title when nothing read touches the question
    think: bool = True  # a short templated <think> before every action
    reader: str = "first_title"  # a key of READER_RULES
    query: str = "question"  # the first query's rule, a key of QUERY_RULES

    def __post_init__(self) -> None:
        if self.expand not in TEACHER_EXPAND_MODES:
            raise ValueError(f"teacher expand must be one of {TEACHER_EXPAND_MODES}, not {self.expand!r}")
        if self.reader not in READER_RULES:
            raise ValueError(f"teacher reader must be one of {sorted(READER_RULES)}, not {self.reader!r}")
        if self.query not in QUERY_RULES:
            raise ValueError(f"teacher query must be one of {sorted(QUERY_RULES)}, not {self.query!r}")
        if self.extra_expand < 0 or self.random_expand < 0:
            raise ValueError("extra_expand and random_expand must be >= 0")
        if self.open_rate is not None and not 0.0 <= self.open_rate <= 1.0:
            raise ValueError(f"open_rate must lie in [0, 1] (or None), not {self.open_rate}")
        for name in ("positive_open_rate", "negative_open_rate"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must lie in [0, 1], not {getattr(self, name)}")

    @property
    def name(self) -> str:
        return f"scripted:{self.expand}:{self.reader}"


def content_words(text: str) -> set[str]:
    return {w for w in normalize_answer(text).split() if w not in _STOPWORDS and len(w) > 1}


def snapshot_candidates(observation: str, titles: Sequence[str], title_chars: int) -> list[ShownCandidate]:
    """The candidates a ``<snapshot>`` showed (numbered lines), titles cut as the previews cut them."""
    lines = {int(m.group(1)): observation[m.end():].split("\n", 1)[0] for m in _NUMBERED.finditer(observation)}
    return [ShownCandidate(n, titles[n - 1][:title_chars], lines[n]) for n in sorted(lines) if 1 <= n <= len(titles)]


def information_passages(observation: str, opened: Sequence[int], titles: Sequence[str]) -> list[OpenedPassage]:
    """The opened passages an ``<information>`` observation shows, in its order (a passage the
    observation's token cap cut off entirely is not there; one cut midway keeps what is shown)."""
    body = observation.removeprefix("<information>\n").removesuffix("\n</information>")
    wanted = set(opened)
    marks = [m for m in _NUMBERED.finditer(body) if int(m.group(1)) in wanted]
    passages = []
    for mark, following in zip(marks, marks[1:] + [None]):
        number = int(mark.group(1))
        block = body[mark.end():following.start() if following else len(body)].strip()
        title = titles[number - 1] if 1 <= number <= len(titles) else ""
        text = block[len(title):] if title and block.startswith(title) else block
        text = "" if text.strip() == ": already read above." else text.strip()
        passages.append(OpenedPassage(number, title, text))
    return passages


class ScriptedTeacher:
    """Policy state for one episode: :meth:`first`, then :meth:`act` on each observation and info."""

    def __init__(self, example: QAExample, env_config: EnvConfig, settings: ScriptedTeacherConfig,
                 rng: random.Random | None = None):
        self.example, self.config, self.settings = example, env_config, settings
        self.reader = READER_RULES[settings.reader]
        self.rng = rng or random.Random(0)
        self.question_words = content_words(example.question)
        self.searched: list[str] = []
        self.candidates: list[ShownCandidate] = []  # every candidate shown, over all snapshots
        self.opened_titles: set[str] = set()
        self.readings: list[list[OpenedPassage]] = []

    def _think(self, key: str, **values: str) -> str:
        return f"<think>{THINK_TEXTS[key].format(**values)}</think>\n" if self.settings.think else ""

    def first(self) -> str:
        query = QUERY_RULES[self.settings.query](self.example.question)
        self.searched.append(normalize_answer(query))
        return self._think("search") + format_search(query)

    def act(self, observation: str, info: dict) -> str:
        """The next action after an env step that returned ``observation`` and ``info``."""
        search = info.get("search")
        if info.get("action") == "search" and search is not None and search["ids"]:
            self.candidates += snapshot_candidates(observation, search["titles"], self.config.preview.title_chars)
            return self._expand(search)
        if info.get("action") == "expand" and search is not None:
            reading = information_passages(observation, search["expanded"], search["titles"])
            self.opened_titles.update(normalize_answer(p.title) for p in reading)
            self.readings.append(reading)
        return self._after_reading(int(info.get("n_actions", 0)))

    def _expand(self, search: dict) -> str:
        n, limit = len(search["ids"]), self.config.max_expand
        if self.settings.expand == "positives":  # gold-guided: the positive labels choose
            chosen = [i + 1 for i in range(n) if search["positive"][i]][:limit]
            others = [i + 1 for i in range(n) if not search["positive"][i]]
            extra = min(self.settings.extra_expand, len(others), max(0, limit - len(chosen)))
            chosen = sorted(chosen + self.rng.sample(others, extra))
        elif self.settings.expand == "labels":  # a coin per candidate, weighted by its label
            rates = (self.settings.negative_open_rate, self.settings.positive_open_rate)
            chosen = [i + 1 for i in range(n) if self.rng.random() < rates[bool(search["positive"][i])]][:limit]
        elif self.settings.open_rate is not None:  # each candidate a coin of its own, at most max_expand
            chosen = [i for i in range(1, n + 1) if self.rng.random() < self.settings.open_rate][:limit]
        else:
            chosen = sorted(self.rng.sample(range(1, n + 1), min(self.settings.random_expand, n, limit)))
        action = format_expand(chosen, n_candidates=n, form=self.config.expand_form)
        if not chosen:
            return self._think("expand_none") + action
        return self._think("expand", ids=", ".join(map(str, chosen))) + action

    def _after_reading(self, n_actions: int) -> str:
        fits = n_actions + 3 <= self.config.max_actions  # search, expand, answer
        if self.settings.second_search and fits and len(self.searched) < self.config.max_searches \
                and not self._read_on_topic():
            query = self._follow_up_query()
            if query is not None:
                self.searched.append(normalize_answer(query))
                return self._think("search_again", query=query) + format_search(query)
        answer = self.reader(self.example.question, self.readings)
        return self._think("answer_unknown" if answer == UNKNOWN_ANSWER else "answer") + format_answer(answer)

    def _read_on_topic(self) -> bool:
        return any(content_words(f"{p.title} {p.text}") & self.question_words for r in self.readings for p in r)

    def _follow_up_query(self) -> str | None:
        """The shown title of the unopened candidate whose snapshot line shares the most content
        words with the question (first shown wins ties); None when no candidate shares any."""
        best, best_overlap = None, 0
        for candidate in self.candidates:
            key = normalize_answer(candidate.title)
            if not key or key in self.opened_titles or key in self.searched:
                continue
            overlap = len(content_words(candidate.line) & self.question_words)
            if overlap > best_overlap:
                best, best_overlap = candidate.title, overlap
        return best


def collect_scripted(examples: Sequence[QAExample], retriever: Any, env_config: EnvConfig | None = None,
                     settings: ScriptedTeacherConfig | None = None, num_envs: int = 16, seed: int = 0,
                     tokenizer: Any | None = None, offset: int = 0, samples: int = 1) -> list[dict]:
    """``samples`` scripted-teacher trajectories per example (consecutive records), ``num_envs``
    episodes per env step.

    ``tokenizer``: the POLICY's tokenizer, so the env counts observation caps in its tokens
    (as in the policy's rollouts); None counts words. ``offset``: the position of ``examples[0]``
    in a longer question list collected in chunks (the env seeds then match one whole pass);
    each teacher's choices are seeded by ``seed``, its question id and its sample number, so the
    samples of one question open different candidates and (reading them) answer differently.
    """
    if samples < 1:
        raise ValueError(f"samples must be at least 1, not {samples}")
    env_config = env_config or EnvConfig()
    settings = settings or ScriptedTeacherConfig()
    episodes = [(ex, k) for ex in examples for k in range(samples)]
    venv = SearchVectorEnv(retriever, num_envs=max(1, min(num_envs, len(episodes) or 1)), config=env_config,
                           tokenizer=tokenizer)
    records: list[dict] = []
    for start in range(0, len(episodes), venv.num_envs):
        batch = episodes[start:start + venv.num_envs]
        records += _play_batch(venv, batch, env_config, settings, seed, offset * samples + start)
    return records


def teacher_rng(seed: int, example_id: str, sample: int) -> random.Random:
    """The coins of one teacher episode (sample 0 keeps the seed of a one-sample collection)."""
    return random.Random(f"{seed}:{example_id}" if sample == 0 else f"{seed}:{example_id}:{sample}")


def _play_batch(venv: Any, episodes: list[tuple[QAExample, int]], env_config: EnvConfig,
                settings: ScriptedTeacherConfig, seed: int, start: int) -> list[dict]:
    batch = [ex for ex, _ in episodes]
    n = len(batch)
    venv.reset(seed=seed + start, examples=batch + [batch[0]] * (venv.num_envs - n))
    teachers = [ScriptedTeacher(ex, env_config, settings, teacher_rng(seed, ex.id, k)) for ex, k in episodes]
    turns: list[list[tuple[str, str]]] = [[] for _ in batch]
    pending: list[str | None] = [t.first() for t in teachers] + [None] * (venv.num_envs - n)
    summaries: list[dict | None] = [None] * n
    answered = [False] * n
    while any(a is not None for a in pending):
        observations, _, terminated, truncated, infos = venv.step(pending)
        following: list[str | None] = [None] * venv.num_envs
        for k in range(n):
            action = pending[k]
            if action is None:
                continue
            turns[k].append(("model", action))
            if terminated[k] or truncated[k]:
                summaries[k], answered[k] = infos[k]["episode"], bool(terminated[k])
                continue
            turns[k].append(("observation", observations[k]))
            following[k] = teachers[k].act(observations[k], infos[k])
        pending = following
    ended = [summary for summary in summaries if summary is not None]
    assert len(ended) == n  # an episode's actions stop only once the env has ended it
    return [make_record(ex, settings.name, seeds_r1_prompt(ex.question, env_config), turns[k], ended[k],
                        answered[k]) for k, ex in enumerate(batch)]
