"""Configuration of the search environment (defaults from the SEEDS-R1 setting)."""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from pathlib import Path

from envs import typed_config
from envs.previews import PreviewConfig
from envs.protocol import JudgeForm, judge_form
from envs.rewards import RewardConfig

ADMISSION_MODES = ("preview", "prefix")
DUPLICATE_QUERY_POLICIES = ("penalize", "allow")


@dataclass(frozen=True)
class EnvConfig:
    admission: str = "preview"  # "preview": snapshot then expand; "prefix": all K candidates at once
    candidates_per_search: int = 5  # K, the retriever's hits per search (YAML key `top_k` before: still read)
    max_searches: int = 4  # search actions at most per episode
    max_actions: int = 10  # actions at most per episode (the episode is cut after this many)
    max_obs_tokens: int = 1200  # token cap of each observation (passages are cut to fit)
    max_expand: int = 5  # candidates at most opened by one expand action
    require_expand: bool = True  # preview mode: the action after a snapshot must be an expand
    duplicate_query: str = "penalize"  # a repeated (normalised) query: "penalize" = invalid, "allow"
    distractor_rate: float = 0.0  # rho: chance that each candidate is replaced by a random passage
    # "list": <expand>2, 5</expand>; "judge": <expand>[1] no [2] yes ...</expand>, every candidate judged
    expand_form: str = "list"
    shuffle_candidates: bool = False  # show each snapshot's candidates in a random (per-episode seeded) order
    # judgement form: the snapshot carries a "Question: ..." line and each verdict question restates it
    # ("Does [i] help answer: <question>?"), so the question sits next to every preview
    judge_question: bool = False
    # judgement form: "stream" = verdicts interleaved in the episode's token stream; "alone" = each
    # candidate judged in a short context of its own (envs.protocol.judge_alone_prompts), the episode's
    # stream then shows the snapshot and the expand those verdicts make
    judge_context: str = "stream"
    preview: PreviewConfig = field(default_factory=PreviewConfig)  # how each candidate's preview is cut
    reward: RewardConfig = field(default_factory=RewardConfig)  # the episode reward's weights

    def __post_init__(self) -> None:
        if self.admission not in ADMISSION_MODES:
            raise ValueError(f"admission must be one of {ADMISSION_MODES}, not {self.admission!r}")
        judge_form(self.expand_form, self.judge_context)  # refuses a form that is none of the three
        if self.duplicate_query not in DUPLICATE_QUERY_POLICIES:
            raise ValueError(f"duplicate_query must be one of {DUPLICATE_QUERY_POLICIES}")
        if not 0.0 <= self.distractor_rate <= 1.0:
            raise ValueError("distractor_rate must lie in [0, 1]")
        for name in ("candidates_per_search", "max_searches", "max_actions", "max_obs_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        if self.max_expand < 0:
            raise ValueError("max_expand must be >= 0")

    @property
    def judge_form(self) -> JudgeForm:
        """How the policy chooses what to open (:class:`envs.protocol.JudgeForm`), from
        ``expand_form`` and ``judge_context``: the one place the two are read together."""
        return judge_form(self.expand_form, self.judge_context)

    @classmethod
    def from_dict(cls, values: dict) -> EnvConfig:
        """Build from a plain (e.g. YAML) dict, strictly (:func:`envs.typed_config.from_dict`):
        nested ``preview`` and ``reward`` sections, unknown keys are errors."""
        return typed_config.from_dict(cls, dict(values))

    @classmethod
    def upgrade_keys(cls, values: dict) -> dict:
        """The old key ``top_k`` (easy to confuse with sampling top-k) read as ``candidates_per_search``."""
        values = dict(values)
        if "top_k" in values:
            warnings.warn("env config key `top_k` is now `candidates_per_search`; "
                          "the old key goes in the next release", DeprecationWarning, stacklevel=3)
            values["candidates_per_search"] = values.pop("top_k")
        return values

    @classmethod
    def from_yaml(cls, path: str | Path) -> EnvConfig:
        """Load a YAML recipe such as ``configs/env/seeds_r1.yaml`` (``base: other.yaml`` allowed)."""
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"env config not found: {path}")
        return cls.from_dict(typed_config.read_recipe(path))
