"""The settings of one SFT warm start (:class:`WarmStartConfig`): one tree of sections
(:mod:`training.sft_sections`), read from YAML recipes in ``configs/sft/`` with ``--section.field value``
overrides on top (:func:`training.sft.resolve_config`). The flat names of earlier recipes, run folders
and command lines (``--epochs 1``, ``--teacher_llm x``) are still read, through
:data:`training.sft_sections.OLD_SFT_KEYS`, with one deprecation line."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envs import typed_config
from envs.config import EnvConfig
from training.config_sections import check_env_overrides
from training.sft_sections import (  # noqa: F401  (re-exported)
    OLD_SFT_KEYS,
    SFT_LOSS_AGGS,
    DevSettings,
    SFTDataSettings,
    SFTModelSettings,
    SFTRunSettings,
    SFTTrainSettings,
    TeacherSettings,
    upgrade_sft_keys,
)
from training.teachers.scripted_teacher import ScriptedTeacherConfig

PAPER_RECIPE = "configs/sft/seeds_r1_paper.yaml"


@dataclass
class WarmStartConfig:
    """Everything one warm start needs; loadable from YAML (:meth:`from_yaml`), CLI overrides on top."""

    model: SFTModelSettings = field(default_factory=SFTModelSettings)  # the policy: base model, precision, LoRA
    data: SFTDataSettings = field(default_factory=SFTDataSettings)  # the questions and the retriever
    env: dict = field(  # EnvConfig overrides (defaults = SEEDS-R1 limits)
        default_factory=dict, metadata={typed_config.OVERRIDES: EnvConfig})
    teacher: TeacherSettings = field(default_factory=TeacherSettings)  # the teacher and its collection
    train: SFTTrainSettings = field(default_factory=SFTTrainSettings)  # the rows and the optimisation
    dev: DevSettings = field(default_factory=DevSettings)  # the dev split and its evaluation after each epoch
    run: SFTRunSettings = field(default_factory=SFTRunSettings)  # the run folder and the seed

    def __post_init__(self) -> None:
        """The checks that span two sections, and the scripted teacher's rules (each section checks its own)."""
        check_env_overrides(self.env)
        self.scripted_teacher()  # validates the scripted teacher's settings

    def scripted_teacher(self) -> ScriptedTeacherConfig:
        t = self.teacher
        return ScriptedTeacherConfig(expand=t.expand, extra_expand=t.extra_expand, random_expand=t.random_expand,
                                     open_rate=t.open_rate, positive_open_rate=t.positive_open_rate,
                                     negative_open_rate=t.negative_open_rate, second_search=t.second_search,
                                     think=t.think, reader=t.reader, query=t.query)

    @classmethod
    def upgrade_keys(cls, values: dict[str, Any]) -> dict[str, Any]:
        """The flat keys of earlier recipes, run folders and command lines moved into their sections
        (:data:`training.sft_sections.OLD_SFT_KEYS`), with one deprecation line."""
        return upgrade_sft_keys(values)

    @classmethod
    def from_dict(cls, values: dict) -> WarmStartConfig:
        """Strictly, through the project's one loader (:func:`envs.typed_config.from_dict`); old flat keys
        are read through :meth:`upgrade_keys`."""
        return typed_config.from_dict(cls, values or {})

    @classmethod
    def from_yaml(cls, path: str | Path, overrides: dict | None = None) -> WarmStartConfig:
        """A recipe (``base: other.yaml`` allowed) with ``overrides`` (nested or old flat keys) on top."""
        return cls.from_dict(typed_config.merge_values(typed_config.read_recipe(Path(path), cls),
                                                       typed_config.upgrade(cls, overrides or {})))

    def env_config(self) -> EnvConfig:
        return EnvConfig.from_dict(self.env) if self.env else EnvConfig()

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)
