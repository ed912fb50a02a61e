"""Single-call answering prompts: no retrieval, retrieved passages, and the final-answer back-off."""

CLOSED_BOOK = (
    "Reply to the question below with the answer only: a name, a number, a date or a short "
    "phrase, without explanation.\n\nQuestion: {question}"
)

WITH_PASSAGES = (
    "Here are some passages that may help.\n\n{docs}\n\n"
    "Using the passages where they help, reply to the question with the answer only: a name, a "
    "number, a date or a short phrase, without explanation.\n\nQuestion: {question}"
)

BACKOFF = (
    "{work}\n\nThe work above did not reach a final answer. Based on it, reply to the question "
    "with the answer only (a few words), without explanation.\n\nQuestion: {question}"
)
