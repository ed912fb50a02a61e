"""SEEK prompts (sketch-guided knowledge construction), written in our own words.

The sketch is shown to the model as a numbered outline of topics ("gists"), each followed by
an ``Evidence:`` line that reads ``[to be filled]`` until its slot is filled. The model does not
rewrite the outline (only the ``update`` ablation's UPDATE prompt asks it to, in the same form):
it writes the topics once, then one query and one piece of evidence at a time, and the method
fills the slot itself.
"""

EMPTY_SLOT = "[to be filled]"
NO_EVIDENCE = "(no evidence found)"

SKETCH = (
    "Before searching, plan what knowledge is needed to answer the question below. Break it into "
    "a few topics (usually three to five; fewer if the question is simple), in the order in which "
    "they should be looked up, so that later topics can build on what earlier ones find. Name each "
    "topic in a few words. Do not state or guess the answer in the topic names.\n\n"
    "Question: {question}\n\n"
    "Write the topics as a numbered list, one per line (1. topic), and nothing else."
)

SUBQUERY = (
    "You are gathering evidence to answer a question, one topic at a time.\n\n"
    "Question: {question}\n\n{context}\n\nTopic to research now: {focus}\n\n"
    "Think briefly about what is already known and what this topic still needs, then write one "
    "search query for it: short, self-contained, naming people, places and things explicitly.\n"
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
    "Write the evidence for this topic: one to three sentences stating the facts from the "
    "documents that bear on the topic and the question, with names, dates and numbers. Write only "
    "the evidence, not the outline. If the documents hold nothing relevant, write: nothing relevant."
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
    "Using the evidence gathered above and what you know, reply to the question with the answer "
    "only: a name, a number, a date or a short phrase, without explanation.\n\nQuestion: {question}"
)

# How the gathered knowledge is shown in the prompts above ({context}).
OUTLINE_HEADING = "Outline of topics, with the evidence found so far:"
PLAN_HEADING = "Plan of topics to research:"
NOTES_HEADING = "Notes gathered so far:"
NO_NOTES = "(none yet)"
NOTES_FOCUS = "whatever the notes still lack to answer the question"
PLAN_DONE_FOCUS = "whatever the notes still lack to answer the question (every plan topic has had a search)"
