"""A scripted stand-in LLM: a function of the rendered prompt decides the reply.

It honours stop strings (kept in the output, nothing after them), counts words as tokens and
records every batch it receives, so tests can drive any method deterministically.
"""
from __future__ import annotations

from collections.abc import Callable

from inference.backends.chat import plain_chat
from methods.llm import Completion, GenerationRequest, GenerationResult, LLMBackend


def prompt_text(request: GenerationRequest) -> str:
    if isinstance(request.prompt, str):
        return request.prompt
    if request.prompt and isinstance(request.prompt[0], int):
        return " ".join(map(str, request.prompt))
    return plain_chat(request.prompt)


class FakeLLM(LLMBackend):
    name = "fake"

    budget_before_stop = False  # True: a stop string past max_tokens words is never reached (as in a real model)

    def __init__(self, respond: Callable[[str], str]):
        self.respond = respond
        self.batches: list[int] = []
        self.prompts: list[str] = []

    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        self.batches.append(len(requests))
        results = []
        for request in requests:
            text = prompt_text(request)
            self.prompts.append(text)
            reply = self.respond(text)
            finish, stop_string = "length", None
            cut = min(((reply.find(s) + len(s), s) for s in request.stop if s in reply), default=None)
            if cut is not None and self.budget_before_stop and len(reply[: cut[0]].split()) > request.max_tokens:
                cut = None
            if cut is not None:
                reply, finish, stop_string = reply[: cut[0]], "stop", cut[1]
            words = reply.split()
            if cut is None and len(words) > request.max_tokens:
                reply = " ".join(words[: request.max_tokens])
            elif cut is None:
                finish = "eos"
            completion = Completion(reply, list(range(len(reply.split()))), [0.0] * len(reply.split()), finish,
                                    stop_string)
            results.append(GenerationResult([completion], list(range(len(text.split())))))
        return results


FAKE_TAGS = ("Maybe <search>fake query Berlin</search> first, or <expand>9</expand>, or just <answer>Berlin</answer>? "
             "Then <read>3</read> and </next_query> and </index> and </answer>.\n"
             "So the answer is: Berlin.\nFinal Information: Berlin.\nQuery: Berlin wall\n1. Berlin topic\n"
             "direction: wrong | query: Berlin\nObservation: Berlin. State: Berlin.\nsufficient yes\n\n")


def long_thinking(words: int = 1000) -> str:
    """A ``<think>`` block of about ``words`` words whose every paragraph holds fake tags, stop strings
    (``\\n``, ``\\n\\n``, closing tags) and answer-like lines that must not count."""
    filler = "I need to reason about which evidence matters and check each candidate before acting. "
    paragraph = filler * 3 + FAKE_TAGS
    text = ""
    while len(text.split()) < words:
        text += paragraph
    return f"<think>\n{text}</think>\n\n"


class ThinkingLLM(FakeLLM):
    """A scripted reasoning model: every reply is :func:`long_thinking` and then what ``respond`` says.

    A continued call (the prompt ends with the start of the reply it is writing) goes on from
    there; ``respond`` is asked once per call, so stateful scripts stay in step. Prompt ids are not
    reported, so continuations come back as text (chat: the assistant message continued)."""

    budget_before_stop = True

    def __init__(self, respond: Callable[[str], str], words: int = 1000):
        self.thinking = long_thinking(words)
        self.replies: dict[str, str] = {}
        self.script = respond
        super().__init__(self._reply)

    def _reply(self, prompt: str) -> str:
        start = prompt.rfind("<think>")
        if start >= 0:
            base, written = prompt[:start].rstrip(), prompt[start:]
            full = self.replies.get(base)
            if full is not None and full.startswith(written) and len(written) < len(full):
                return full[len(written):]
        full = self.thinking + self.script(prompt)
        self.replies[prompt.rstrip()] = full
        return full

    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        results = super().generate(requests)
        for result in results:
            result.prompt_token_ids = []
        return results
