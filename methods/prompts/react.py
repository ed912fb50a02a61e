"""ReAct-style agent prompts: fixed-k prefix reading, dynamic-k prefix reading, and SEEDS-ReAct."""

_TOOLS_AND_ANSWER = (
    "You may search at most {max_searches} times. When you are confident, or out of searches, "
    "give the final reply as <answer>short answer</answer>: just the name, number, date or "
    "phrase asked for.\n\nQuestion: {question}\n"
)

FIXED_K = (
    "Find the answer to the question by searching a Wikipedia index. Think briefly before each "
    "step. To search, write <search>your query</search> and stop; the {k} best-matching passages "
    "come back inside <information> … </information>. " + _TOOLS_AND_ANSWER
)

DYNAMIC_K = (
    "Find the answer to the question by searching a Wikipedia index. Think briefly before each "
    "step. To search, write <search>your query</search> and stop. You will be told how many "
    "passages were found, ranked best first, without seeing them. Then decide how many of the "
    "top-ranked passages to read, from 0 to {k}: write <read>number</read> and stop; those "
    "passages come back inside <information> … </information>. Read more when the question is "
    "hard, fewer when the first results should suffice. " + _TOOLS_AND_ANSWER
)

DYNAMIC_K_PROMPT = (
    "<retrieved>{n} passages found, ranked best first. "
    "How many of the top ones will you read?</retrieved>"
)

SEEDS_REACT = (
    "Find the answer to the question by searching a Wikipedia index. Think briefly before each "
    "step. To search, write <search>your query</search> and stop. You get a <snapshot> listing up "
    "to {k} candidate passages, one per line as [number] Title: a short excerpt. After every "
    "snapshot you must decide which candidates to open: write <expand>numbers</expand> (for "
    "example <expand>2, 5</expand>) or <expand>none</expand>, and stop; the full text of the "
    "opened passages comes back inside <information> … </information>. Open every candidate that "
    "may help; leave out only those that are clearly unrelated or repeat what you already read. "
    "You may open at most {max_expand} per snapshot. " + _TOOLS_AND_ANSWER
)
