"""MAPS prompts: judge the gathered knowledge, plan parallel searches, consolidate their evidence.

Every prompt starts from the same working memory, rendered by :mod:`methods.maps`: the question,
the knowledge observations gathered so far and the current reasoning state (or, in the
``no_disentanglement`` ablation, the whole trajectory of past searches and notes).

Reply formats, one item per line:

- judge: the single word ``sufficient`` or ``insufficient``;
- directions: ``direction: <what to find out> | query: <search query>``;
- sub-queries only (``no_retrieval_direction``): ``query: <search query>``;
- refine: ``Observation: <new facts>`` then ``State: <what is settled, what is missing>``.
"""

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

JUDGE = (
    "You are answering a question by searching Wikipedia step by step.\n\n{memory}\n\n"
    "Decide whether the knowledge gathered so far is enough to answer the question with "
    "confidence. Reply with one word: sufficient or insufficient."
)

DIRECTIONS = (
    "You are answering a question by searching Wikipedia step by step.\n\n{memory}\n\n"
    "Plan the next searches. Think about what is still unknown and identify {directions}: "
    "different facts or entities to look up, which together cover what is missing, rather than "
    "rewordings of one search. For each direction write one "
    "short, self-contained search query (name the entities; no pronouns). Write one line per "
    "direction, exactly like this:\n"
    "direction: <what to find out> | query: <search query>"
)

SUB_QUERIES = (
    "You are answering a question by searching Wikipedia step by step.\n\n{memory}\n\n"
    "Write {queries} that would find what is still unknown. Make each "
    "query short and self-contained (name the entities; no pronouns). Write one line per query, "
    "exactly like this:\n"
    "query: <search query>"
)

REFINE = (
    "You are answering a question by searching Wikipedia step by step.\n\n{memory}\n\n"
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


def directions_wanted(n: int) -> str:
    """How many directions the planning prompt asks for, in words."""
    if n == 1:
        return "the single most useful retrieval direction"
    return f"{n} complementary retrieval directions"


def queries_wanted(n: int) -> str:
    """How many sub-queries the ``no_retrieval_direction`` prompt asks for, in words."""
    return "one search query" if n == 1 else f"{n} different search queries"
