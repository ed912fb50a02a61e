"""KAIR prompts: iterative retrieval with a knowledge index that the model keeps up to date.

Every step asks for up to four tagged parts, in this order: ``<index>`` (the knowledge index,
in one of five formats), ``<think>`` (brief reasoning), ``<judgement>`` (sufficient or
insufficient) and ``<next_query>`` (the next search, or none). Without an index (the
``no_index`` and ``no_evolving`` ablations) the first part is left out.
"""

INDEX_FORMATS = {
    "keywords_relations": (
        "the knowledge index in two lists. Under 'Keywords:' put the key entities, names, dates "
        "and numbers that bear on the question, one per line starting with '- '. Under "
        "'Relations:' put one line per link between two keywords, written as "
        "head -> relation -> tail, with the relation worded as in the documents. Nothing else."
    ),
    "summary": (
        "the knowledge index as a short plain-text summary, a few sentences that keep every "
        "name, date and number from the documents that bears on the question."
    ),
    "keywords": (
        "the knowledge index as a keyword list. Under 'Keywords:' put the key entities, names, "
        "dates and numbers that bear on the question, one per line starting with '- '. Nothing else."
    ),
    "facts": (
        "the knowledge index as a fact list. Under 'Facts:' put each fact from the documents that "
        "bears on the question as one short, self-contained statement per line starting with '- '."
    ),
    "keywords_facts": (
        "the knowledge index as keywords with their facts. One line per key entity, name, date or "
        "number that bears on the question: the keyword, a colon, then the facts the documents give "
        "about it separated by semicolons (for example: Seine: river in northern France; flows "
        "through Paris)."
    ),
}

_PARTS_AFTER_INDEX = (
    "{n_think}. <think>…</think>: in a few sentences, what the documents establish and what is "
    "still missing.\n"
    "{n_judge}. <judgement>…</judgement>: the single word sufficient if you can now answer the "
    "question, otherwise insufficient.\n"
    "{n_query}. <next_query>…</next_query>: if insufficient, one short search query for the "
    "missing piece; if sufficient, the word none."
)


def step_parts(index_instruction: str | None) -> str:
    """The numbered list of parts a step must write (without the index part when it is None)."""
    if index_instruction is None:
        return _PARTS_AFTER_INDEX.format(n_think=1, n_judge=2, n_query=3)
    return f"1. <index>…</index>: {index_instruction}\n" + _PARTS_AFTER_INDEX.format(n_think=2, n_judge=3, n_query=4)


FIRST_STEP = (
    "You are collecting evidence for a question that may need several searches, and you keep "
    "notes as you go. Read the documents found for the question.\n\n"
    "Question: {question}\n\nDocuments:\n{docs}\n\n"
    "Write these parts, in this order, each inside its tags:\n{parts}"
)

NEXT_STEP = (
    "You are collecting evidence for a question that may need several searches, and you keep "
    "notes as you go. Below are your notes from the previous search and the new documents it "
    "returned.{carry_index}\n\n"
    "Question: {question}\n\nYour previous notes:\n{previous}\n\nNew documents:\n{docs}\n\n"
    "Write these parts, in this order, each inside its tags:\n{parts}"
)

CARRY_INDEX = (
    " Update the knowledge index: start from the one in your notes, keep what still matters "
    "and add what the new documents contribute."
)

REPAIR = (
    "Your reply below is missing some required parts.\n\n"
    "Question: {question}\n\nDocuments:\n{docs}\n\nYour reply:\n{output}\n\n"
    "Write only the missing parts, each inside its tags:\n{missing}"
)

MISSING_PART = {
    "index": "<index>…</index>: {index_instruction}",
    "judgement": "<judgement>…</judgement>: the single word sufficient or insufficient.",
    "next_query": "<next_query>…</next_query>: one short search query for what is still missing.",
}

BUILD_INDEX = (
    "Build a knowledge index from all the documents below, for the question that follows.\n\n"
    "Documents:\n{docs}\n\nQuestion: {question}\n\n"
    "Write <index>…</index> holding {index_instruction}"
)

_ANSWER_ONLY = (
    "reply to the question with the answer only: a name, a number, a date or a short phrase, "
    "without explanation.\n\nQuestion: {question}"
)

ANSWER_WITH_INDEX_AND_DOCS = (
    "Knowledge index built while searching:\n{index}\n\nDocuments:\n{docs}\n\n"
    "Use the knowledge index to find your way through the documents, then " + _ANSWER_ONLY
)

ANSWER_WITH_DOCS = "Documents:\n{docs}\n\nUsing the documents, " + _ANSWER_ONLY

ANSWER_WITH_INDEX = "Knowledge index built while searching:\n{index}\n\nUsing the knowledge index, " + _ANSWER_ONLY

FIRST_PURPOSE = "documents that help answer the question"
NEXT_PURPOSE = "find the missing piece: {query}"
