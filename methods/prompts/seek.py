"""SEEK prompts (sketch-guided knowledge construction), written in our own words.

The sketch is shown to the model as a numbered outline of topics ("gists"), each followed by
an ``Evidence:`` line that reads ``[to be filled]`` until its slot is filled. The model does not
rewrite the outline (only the ``update`` ablation's UPDATE prompt asks it to, in the same form):
it writes the topics once, then one query and one piece of evidence at a time, and the method
fills the slot itself.

The instructions carry those of SEEK's public code (PAGER; shared/notes/seed_methods.md §1.5),
reworded: the sketch analyses what knowledge the question needs and how it fits together, then
lays out as many topics as needed (no count asked for), none overlapping, logically ordered,
none revealing the answer; a slot is filled from the documents AND the model's own knowledge,
on topic, relevant and not redundant; the answer follows the sketch's evidence where it suffices
and the model's knowledge where it does not. With ``reasoning_first`` (the paper preset) the
sketch call writes its analysis before the topics (after a ``Topics:`` line) and the answer call
reasons before a short answer in ``<answer>`` tags, as PAGER asks; without it both reply directly
(short budgets for small models: a named deviation).
"""

EMPTY_SLOT = "[to be filled]"
NO_EVIDENCE = "(no evidence found)"

SKETCH = (
    "Before searching, plan what knowledge is needed to answer the question below.\n\n"
    "Question: {question}\n\n"
    "First work out which pieces of knowledge the question requires and how they depend on one "
    "another. Then lay out the topics to research: as many as the question needs and no more, each "
    "covering its own piece so that no two overlap, in the order in which they should be looked up "
    "so that each builds on what the earlier ones find. Name each topic in a few words, and do not "
    "state, guess or hint at the answer in the topic names.\n\n{output}"
)
SKETCH_DIRECT = "Write the topics as a numbered list, one per line (1. topic), and nothing else."
TOPICS_MARKER = "Topics:"
SKETCH_REASONED = (
    "Write your analysis first. Then write a line reading only 'Topics:', followed by the topics as a "
    "numbered list, one per line (1. topic), with nothing after the list."
)

SUBQUERY = (
    "You are gathering evidence to answer a question, one topic at a time.\n\n"
    "Question: {question}\n\n{context}\n\nTopic to research now: {focus}\n\n"
    "Think briefly about what is already known and what the question needs from this topic, then "
    "write one search query for it: focused and short, usable in a search engine without further "
    "context, naming people, places and things explicitly.\n"
    "Reply in two lines:\nReasoning: <one sentence>\nQuery: <search query>"
)

PARALLEL_QUERIES = (
    "You are gathering evidence to answer a question, guided by an outline of topics.\n\n"
    "Question: {question}\n\n{context}\n\n"
    "For every numbered topic of the outline, write one search query that would find evidence "
    "for it: short, self-contained, naming people, places and things explicitly. Reply with a "
    "numbered list whose numbers match the topics (1. query), one per line, and nothing else."
)

REFINE = (
    "A search was made to gather evidence for one topic.\n\n"
    "Question: {question}\n\n{context}\n\nTopic to fill: {focus}\nSearch query: {query}\n\n"
    "Documents:\n{docs}\n\n"
    "Fill this topic only. Using the documents and what you already know, write a short paragraph "
    "(one to three sentences) that stays on this topic, bears on the question and does not repeat "
    "what the other topics already hold, with names, dates and numbers. Write only the evidence, "
    "not the outline. If neither the documents nor what you know bear on the topic, write: nothing "
    "relevant."
)

JUDGE = (
    "Question: {question}\n\n{context}\n\n"
    "Is the information gathered above enough to answer the question? Reply yes or no."
)

UPDATE = (
    "Here is an outline of topics for answering a question, with the evidence found so far.\n\n"
    "Question: {question}\n\n{context}\n\n"
    "Should the outline change now? You may remove topics that are redundant or no longer "
    "needed, add topics for knowledge that is still missing, reword topics, delete parts of a "
    "topic's evidence that do not bear on the question, and settle evidence that contradicts "
    "other evidence by keeping the better supported statement. Do not add facts that the evidence "
    "above does not contain. If it should change, write the whole revised outline in the same "
    "form: each topic as a numbered line (1. topic), then its line 'Evidence: ...' (a new topic "
    "gets 'Evidence: [to be filled]'). If it is fine as it is, reply: keep."
)

ANSWER = (
    "{context}\n\n"
    "Answer the question below from the evidence gathered above and what you know: where the evidence "
    "is enough, follow its facts; where it is not, rely on your own knowledge. {output}\n\n"
    "Question: {question}"
)
ANSWER_DIRECT = (
    "Without explanation, reply to the question with the answer only: a name, a number, a date or a "
    "short phrase."
)
ANSWER_REASONED = (
    "Reason step by step first; then reply to the question with the answer only, short (a name, a "
    "number, a date or a short phrase), between <answer> and </answer>."
)

# How the gathered knowledge is shown in the prompts above ({context}).
OUTLINE_HEADING = "Outline of topics, with the evidence found so far:"
PLAN_HEADING = "Plan of topics to research:"
NOTES_HEADING = "Notes gathered so far:"
NO_NOTES = "(none yet)"
NOTES_FOCUS = "whatever the notes still lack to answer the question"
PLAN_DONE_FOCUS = "whatever the notes still lack to answer the question (every plan topic has had a search)"
