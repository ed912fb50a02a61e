"""DeepNote prompts (our own wording): write a note, ask new questions, fold new documents into
the note, compare two notes, answer from the note."""

INIT_NOTE = (
    "You are taking notes to answer a question. Read the documents and write a note that keeps "
    "every fact from them that bears on the question (names, dates, numbers, relations), in a few "
    "plain sentences. Leave out what is irrelevant; do not answer yet.\n\n"
    "Question: {question}\n\nDocuments:\n{docs}\n\nNote:"
)

NEW_QUERIES = (
    "You are researching a question and have the note below. Write {n} new search questions that "
    "would find what the note is still missing. Each should be short, hold the key names, and "
    "differ from the questions already asked. Put one question per line and write nothing else.\n\n"
    "Question: {question}\n\nNote:\n{note}\n\nQuestions already asked: {asked}"
)

REFINE_NOTE = (
    "You are improving a note taken to answer a question. Fold into it every fact from the new "
    "documents that bears on the question; keep what the note already holds unless the documents "
    "correct it. Write the whole improved note in a few plain sentences; do not answer yet.\n\n"
    "Question: {question}\n\nCurrent note:\n{note}\n\nNew documents:\n{docs}\n\nImproved note:"
)

COMPARE = (
    "Two notes were taken to answer the question below. Decide whether note B is better than note A: "
    "it adds facts that matter for the question, or corrects A, without losing what A had.\n\n"
    "Question: {question}\n\nNote A:\n{old}\n\nNote B:\n{new}\n\n"
    "Is note B better than note A? Reply with Yes or No only."
)

ANSWER = (
    "Note taken while researching:\n{note}\n\nUsing the note, reply to the question with the answer "
    "only: a name, a number, a date or a short phrase, without explanation.\n\nQuestion: {question}"
)

EMPTY_NOTE = "(nothing found yet)"
