"""MAIN-RAG prompts (our own wording): one per agent.

- Predictor (agent 1): answer the question from ONE document.
- Judge (agent 2): given the document, the question and agent 1's answer, say whether the document
  supports answering the question, with the single word Yes or No (its first token is what the
  log-probability score reads).
- Final predictor (agent 3): answer from the documents the judge kept, most relevant first.
"""

PREDICT = (
    "Read the document below, then reply to the question with the answer only: a name, a number, "
    "a date or a short phrase, without explanation. If the document does not tell, give your best "
    "guess.\n\nDocument: (Title: {title}) {text}\n\nQuestion: {question}"
)

JUDGE = (
    "You check whether a document is useful evidence for a question. Below are the document, the "
    "question, and an answer someone drew from the document.\n\n"
    "Document: (Title: {title}) {text}\n\nQuestion: {question}\nAnswer drawn from it: {answer}\n\n"
    "Does the document contain information that answers the question and backs that answer? "
    "Reply with Yes or No only."
)

FINAL = (
    "The documents below were checked for relevance and are listed from most to least useful.\n\n"
    "{docs}\n\nUsing the documents where they help, reply to the question with the answer only: a "
    "name, a number, a date or a short phrase, without explanation.\n\nQuestion: {question}"
)

NO_ANSWER = "(no answer)"  # what the judge sees when the predictor gave nothing usable
