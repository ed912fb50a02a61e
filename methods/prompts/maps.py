"""MAPS prompts: judge the gathered knowledge and name directions, write one sub-query per
direction, consolidate the evidence, answer.

Every prompt starts from the same working memory, rendered by :mod:`methods.maps`: the question,
the knowledge observations gathered so far and the current reasoning state (or, in the
``no_disentanglement`` ablation, the whole trajectory of past searches and notes).

Reply formats, one item per line:

- directions (from the second iteration on, after a ``Sufficient: yes|no`` line):
  ``direction: <what to find out>``;
- sub-query (one call per direction): ``query: <search query>``;
- sub-queries only (``no_retrieval_direction``, same verdict line first): ``query: <search query>``;
- refine: ``Observation: <new facts>`` then ``State: <what is settled, what is missing>``;
- ``single_call`` variant: one plan call, ``direction: <what to find out> | query: <search query>``,
  and a separate judge call replying ``sufficient`` or ``insufficient``.
"""

INTRO = "You are answering a question by searching Wikipedia step by step.\n\n{memory}\n\n"

MEMORY = (
    "Question: {question}\n\n"
    "Knowledge gathered so far:\n{observations}\n\n"
    "Current reasoning state: {state}"
)

TRAJECTORY = (
    "Question: {question}\n\n"
    "Your work so far, round by round:\n{rounds}"
)

ROUND = "Round {number}\n  Searches: {searches}\n  Observation: {observation}\n  Reasoning state: {state}"

NOTHING_YET = "(nothing yet)"
NO_STATE = "(no reasoning yet)"
NOTHING_NEW = "(nothing new)"

JUDGE = INTRO + (
    "Decide whether the knowledge gathered so far is enough to answer the question with "
    "confidence. Reply with one word: sufficient or insufficient."
)

# From the second iteration on, the planning call first says whether to stop.
JUDGE_FIRST = (
    "First decide whether the knowledge gathered so far is enough to answer the question with "
    "confidence, and say so on the first line, exactly 'Sufficient: yes' or 'Sufficient: no'. If "
    "yes, write nothing more. If no, on the following lines "
)
NO_JUDGEMENT = "Nothing has been searched yet, so "

DIRECTIONS = INTRO + (
    "{judge}identify {directions}: different facts or entities that are still unknown and that "
    "together cover what is missing, rather than rewordings of one another. Describe each "
    "direction in a short phrase; do not write search queries yet. Write one line per "
    "direction, exactly like this:\n"
    "direction: <what to find out>"
)

SUB_QUERY = INTRO + (
    "Retrieval direction to pursue now: {direction}\n\n"
    "Write one search query that would find the knowledge this direction asks for: short and "
    "self-contained (name the entities; no pronouns). Reply with one line, exactly like this:\n"
    "query: <search query>"
)

SUB_QUERIES = INTRO + (
    "{judge}write {queries} that would find what is still unknown. Make each "
    "query short and self-contained (name the entities; no pronouns). Write one line per query, "
    "exactly like this:\n"
    "query: <search query>"
)

# The ``single_call`` variant: directions and their sub-queries in one call, judged separately.
PLAN = INTRO + (
    "Plan the next searches. Think about what is still unknown and identify {directions}: "
    "different facts or entities to look up, which together cover what is missing, rather than "
    "rewordings of one search. For each direction write one "
    "short, self-contained search query (name the entities; no pronouns). Write one line per "
    "direction, exactly like this:\n"
    "direction: <what to find out> | query: <search query>"
)

REFINE = INTRO + (
    "New evidence from this round of searches:\n{evidence}\n\n"
    "Consolidate the new evidence. Write exactly two lines:\n"
    "Observation: <the facts in the new evidence that bear on the question, with names, dates "
    "and numbers; or 'nothing new'>\n"
    "State: <in one or two sentences, what is now established and what is still missing>"
)

ANSWER = (
    "You are answering a question by searching Wikipedia step by step. The searching is over.\n\n"
    "{memory}\n\n"
    "Using the knowledge above where it helps, reply to the question with the answer only: a "
    "name, a number, a date or a short phrase, without explanation.\n\nQuestion: {question}"
)

EVIDENCE_GROUP = "Direction {number}: {direction} (search: {query})\n{docs}"
EVIDENCE_GROUP_NO_DIRECTION = "Search {number}: {query}\n{docs}"
ALREADY_SHOWN = "(no passages beyond those shown above)"

QUESTION_DIRECTION = "the question as a whole"


def directions_wanted(n: int, fixed: bool) -> str:
    """How many directions the planning prompt asks for, in words: exactly ``n`` when ``fixed``,
    else as many as the missing knowledge calls for, at most ``n``."""
    if n == 1:
        return "the single most useful retrieval direction"
    if fixed:
        return f"{n} complementary retrieval directions"
    return (f"the complementary retrieval directions still needed (one per distinct piece of missing "
            f"knowledge, at most {n})")


def queries_wanted(n: int, fixed: bool = True) -> str:
    """How many sub-queries the ``no_retrieval_direction`` prompt asks for, in words."""
    if n == 1:
        return "one search query"
    return f"{n} different search queries" if fixed else f"up to {n} different search queries"
