"""Baselines: closed-book and single-shot RAG, ReAct (fixed k and dynamic k), Search-o1, the
Search-R1 protocol, IRCoT and Iter-RetGen. Every one of them retrieves through the env."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import ClassVar

from methods.agent_loop import FORCED_ANSWER_MAX_TOKENS, run_agent_turns
from methods.base import Method, paper_limits, register
from methods.context import QuestionContext, StepOutcome
from methods.guidance import ANSWER_CHARS, QUERY_CHARS
from methods.parsing import clean_answer, extract_answer, first_int, last_tag
from methods.prompts import demos, direct, format_docs, iterative, r1, react
from methods.prompts import o1 as o1_prompts
from methods.transcript import ChatTranscript, TokenTranscript

ANSWER_TOKENS = 32
PREFIX_PROTOCOL = {"admission": "prefix"}  # every search shows its K passages at once


async def answer_from(ctx: QuestionContext, prompt: str, tag: str = "answer", max_tokens: int = ANSWER_TOKENS) -> None:
    """One answering call; the first line (or tagged answer) of its output is the answer."""
    result = await ctx.generate([{"role": "user", "content": prompt}], stop=("\n\n",), max_tokens=max_tokens, tag=tag)
    completion = result.completions[0]
    if completion.finish_reason == "error":
        await ctx.give_up("llm_error")
        return
    answer, form = extract_answer(completion.text)
    if form != "tag":
        ctx.note("answer_form", form=form)
    await ctx.answer(answer)


@register("vanilla-llm")
@dataclass
class VanillaLLM(Method):
    """Closed-book: the question alone."""

    answer_tokens: int = ANSWER_TOKENS

    async def run(self, ctx: QuestionContext) -> None:
        await answer_from(ctx, direct.CLOSED_BOOK.format(question=ctx.question), max_tokens=self.answer_tokens)


@register("vanilla-rag")
@dataclass
class VanillaRAG(Method):
    """Retrieve the top-k passages for the question once, then answer from them."""

    paper_env: ClassVar[dict] = paper_limits(k=5)
    answer_tokens: int = ANSWER_TOKENS

    def fixed_env(self) -> dict:
        return dict(PREFIX_PROTOCOL)

    async def run(self, ctx: QuestionContext) -> None:
        outcome = await ctx.search(ctx.question)
        docs = format_docs(outcome.shown) if outcome.valid else "(no passages)"
        await answer_from(ctx, direct.WITH_PASSAGES.format(docs=docs, question=ctx.question),
                          max_tokens=self.answer_tokens)


@register("react")
@dataclass
class ReActFixedK(Method):
    """ReAct reading the top-k prefix after every search (k in {1, 3, 5, 10} in the papers)."""
    action_tags = ("search", "answer")

    paper_env: ClassVar[dict] = paper_limits(k=5, max_searches=4, max_actions=10)
    max_tokens: int = 256
    example: bool = True  # show one worked example of the format first
    forced_answer_tokens: int = FORCED_ANSWER_MAX_TOKENS
    answer_chars: int = ANSWER_CHARS  # guided actions: an answer is one line of at most this many characters
    query_chars: int = QUERY_CHARS  # guided actions: a query is one line of at most this many characters

    def fixed_env(self) -> dict:
        return dict(PREFIX_PROTOCOL)

    async def run(self, ctx: QuestionContext) -> None:
        env = ctx.env.config
        prompt = react.FIXED_K.format(k=env.candidates_per_search, max_searches=env.max_searches, question=ctx.question)
        prompt = demos.with_example(prompt, demos.PREFIX) if self.example else prompt
        await run_agent_turns(ctx, ChatTranscript(prompt), max_tokens=self.max_tokens,
                              forced_answer_tokens=self.forced_answer_tokens, answer_chars=self.answer_chars,
                              query_chars=self.query_chars)


@register("react-dynk")
@dataclass
class ReActDynamicK(Method):
    """ReAct where the model picks how many top-ranked results to read (a prefix), unseen."""
    action_tags = ("search", "read", "answer")

    paper_env: ClassVar[dict] = paper_limits(k=10, max_expand=10, max_searches=4, max_actions=10)
    max_tokens: int = 256
    example: bool = True  # show one worked example of the format first
    forced_answer_tokens: int = FORCED_ANSWER_MAX_TOKENS
    answer_chars: int = ANSWER_CHARS  # guided actions: an answer is one line of at most this many characters
    query_chars: int = QUERY_CHARS  # guided actions: a query is one line of at most this many characters

    def fixed_env(self) -> dict:
        # Preview mode gives "retrieve now, open later"; the model never sees the previews.
        return {"admission": "preview"}

    @staticmethod
    def translate(text: str) -> str:
        """``<read>m</read>`` -> ``<expand>1, ..., m</expand>``; anything else goes to the env as is."""
        count = last_tag(text, "read")
        if count is None:
            return text
        m = first_int(count)
        if m is None or m < 0:
            return text  # the env reports the bad action
        return "<expand>" + (", ".join(str(i) for i in range(1, m + 1)) if m else "none") + "</expand>"

    async def run(self, ctx: QuestionContext) -> None:
        env = ctx.env.config
        prompt = react.DYNAMIC_K.format(k=env.candidates_per_search, max_searches=env.max_searches,
                                        question=ctx.question)
        prompt = demos.with_example(prompt, demos.DYNAMIC_K) if self.example else prompt

        async def hide_previews(outcome: StepOutcome, _: str) -> str | None:
            if outcome.observation.startswith("<snapshot>"):
                return react.DYNAMIC_K_PROMPT.format(n=len(outcome.hits))
            return None

        await run_agent_turns(ctx, ChatTranscript(prompt), max_tokens=self.max_tokens, extra_stops=("</read>",),
                              translate=self.translate, on_observation=hide_previews,
                              forced_answer_tokens=self.forced_answer_tokens, answer_chars=self.answer_chars,
                              query_chars=self.query_chars)


async def reason_in_documents(ctx: QuestionContext, reasoning: str, query: str, hits, max_tokens: int) -> str:
    """Search-o1's reader: condense the documents into what helps this query and reasoning."""
    prompt = o1_prompts.READER.format(reasoning=reasoning.strip() or "(none yet)", query=query, docs=format_docs(hits))
    result = await ctx.generate([{"role": "user", "content": prompt}], max_tokens=max_tokens, tag="reason_in_documents")
    text = result.completions[0].text
    if o1_prompts.READER_MARK in text:
        text = text.split(o1_prompts.READER_MARK, 1)[1]
    else:
        ctx.note("reader_format", detail="no 'Final Information:' mark; using the whole output")
    return f"<result>{text.strip() or 'No useful information.'}</result>"


@register("search-o1")
@dataclass
class SearchO1(Method):
    """Search-o1: reasoning with search tags; a reader condenses the top-k documents of each search."""
    action_tags = ("search", "answer")

    # K=10 is Search-o1's code (top_k 10); 5 searches / 12 actions are our small-model caps, not its:
    # its code allows 10 searches / 15 turns on multi-hop sets and 5 on NQ/TriviaQA (--method.budget paper:
    # methods.budgets.PAPER_LIMITS)
    paper_env: ClassVar[dict] = paper_limits(k=10, max_searches=5, max_actions=12)
    max_tokens: int = 512
    example: bool = True  # show one worked example of the format first
    reader_max_tokens: int = 256
    forced_answer_tokens: int = FORCED_ANSWER_MAX_TOKENS
    answer_chars: int = ANSWER_CHARS  # guided actions: an answer is one line of at most this many characters
    query_chars: int = QUERY_CHARS  # guided actions: a query is one line of at most this many characters

    def fixed_env(self) -> dict:
        return {**PREFIX_PROTOCOL, "duplicate_query": "allow"}

    async def run(self, ctx: QuestionContext) -> None:
        prompt = o1_prompts.REASONER.format(max_searches=ctx.env.config.max_searches, question=ctx.question)
        transcript = ChatTranscript(demos.with_example(prompt, demos.REASONING) if self.example else prompt)

        async def condense(outcome: StepOutcome, model_text: str) -> str | None:
            if not outcome.valid or not outcome.observation.startswith("<information>") or not outcome.shown:
                return None
            query = last_tag(model_text, "search") or ctx.question
            # The reader gets the passages as the env showed them (what doc_tokens counted).
            return await reason_in_documents(ctx, transcript.text, query, outcome.shown, self.reader_max_tokens)

        await run_agent_turns(ctx, transcript, max_tokens=self.max_tokens, on_observation=condense,
                              forced_answer_tokens=self.forced_answer_tokens, answer_chars=self.answer_chars,
                              query_chars=self.query_chars)


@register("search-r1")
@dataclass
class SearchR1(Method):
    """The Search-R1 protocol for trained checkpoints: raw-text prompt, top-k prefix reading."""

    handles_thinking: ClassVar[bool] = False  # its <think> turns are part of the trained format

    paper_env: ClassVar[dict] = paper_limits(k=3, max_searches=4, max_actions=10)
    max_tokens: int = 512

    def fixed_env(self) -> dict:
        return dict(PREFIX_PROTOCOL)

    async def run(self, ctx: QuestionContext) -> None:
        transcript = TokenTranscript(r1.SEARCH_R1.format(question=ctx.question), ctx.tokenizer)
        await run_agent_turns(ctx, transcript, max_tokens=self.max_tokens)


_SENTENCE_END = re.compile(r"(?<=[.!?])\s")


@register("ircot")
@dataclass
class IRCoT(Method):
    """IRCoT: interleave one reasoning sentence with one retrieval using that sentence."""

    paper_env: ClassVar[dict] = paper_limits(k=5)
    max_iterations: int = 5
    max_tokens: int = 64
    answer_tokens: int = ANSWER_TOKENS  # the back-off answer

    def fixed_env(self) -> dict:
        """One search for the question and one per iteration, then the answer (and a spare action)."""
        return {**PREFIX_PROTOCOL, "max_searches": self.max_iterations + 1, "max_actions": self.max_iterations + 3,
                "duplicate_query": "allow"}

    async def run(self, ctx: QuestionContext) -> None:
        outcome = await ctx.search(ctx.question)
        docs = {h.row: h for h in outcome.shown}
        thoughts: list[str] = []
        for _ in range(self.max_iterations):
            prompt = iterative.IRCOT.format(docs=format_docs(list(docs.values())), question=ctx.question,
                                            thoughts=" ".join(thoughts) or "(none)")
            result = await ctx.generate([{"role": "user", "content": prompt}], stop=("\n",), max_tokens=self.max_tokens,
                                        tag="thought")
            if result.completions[0].finish_reason == "error":
                await ctx.give_up("llm_error")
                return
            sentence = _SENTENCE_END.split(result.completions[0].text.strip(), maxsplit=1)[0].strip()
            if not sentence:
                ctx.note("empty_thought")
                break
            thoughts.append(sentence)
            answer, form = extract_answer(sentence)
            if form == "so-the-answer-is":
                await ctx.answer(answer)
                return
            outcome = await ctx.search(sentence)
            for hit in outcome.shown:
                docs.setdefault(hit.row, hit)
        ctx.note("no_final_sentence", thoughts=len(thoughts))
        backoff = direct.BACKOFF.format(work=format_docs(list(docs.values())) + "\n\n" + " ".join(thoughts),
                                        question=ctx.question)
        await answer_from(ctx, backoff, tag="backoff", max_tokens=self.answer_tokens)


@register("iter-retgen")
@dataclass
class IterRetGen(Method):
    """Iter-RetGen: retrieve with the question plus the previous generation, regenerate, repeat."""

    paper_env: ClassVar[dict] = paper_limits(k=5)
    iterations: int = 3
    max_tokens: int = 128

    def fixed_env(self) -> dict:
        """One search per iteration, then the answer."""
        return {**PREFIX_PROTOCOL, "max_searches": self.iterations, "max_actions": self.iterations + 1,
                "duplicate_query": "allow"}

    async def run(self, ctx: QuestionContext) -> None:
        generation = ""
        for _ in range(self.iterations):
            query = f"{ctx.question} {generation}".strip()
            outcome = await ctx.search(query)
            prompt = iterative.ITER_RETGEN.format(docs=format_docs(outcome.shown), question=ctx.question)
            result = await ctx.generate([{"role": "user", "content": prompt}], max_tokens=self.max_tokens,
                                        tag="generate")
            if result.completions[0].finish_reason == "error":
                await ctx.give_up("llm_error")
                return
            generation = " ".join(result.completions[0].text.split())
        answer, form = extract_answer(generation)
        ctx.note("answer_form", form=form)
        await ctx.answer(clean_answer(answer))
