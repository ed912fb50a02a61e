"""Moved: the LLM interface is :mod:`methods.llm` (methods import it without reaching up into
``inference``). This path re-exports it for one release."""
import warnings

from methods.llm import (
              FINISH_REASONS,
              ChatMessages,
              Completion,
              GenerationRequest,
              GenerationResult,
              LLMBackend,
              Prompt,
)

warnings.warn("inference.backends.base moved to methods.llm; the old path goes in the next release",
              DeprecationWarning, stacklevel=2)

__all__ = ["FINISH_REASONS", "ChatMessages", "Completion", "GenerationRequest", "GenerationResult", "LLMBackend",
           "Prompt"]
