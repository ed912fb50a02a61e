"""Prompts of the classic iterative retrieval baselines: IRCoT and Iter-RetGen."""

IRCOT = (
    "Answer the question with the help of the passages. Reason one sentence at a time. When you "
    "can answer, write a sentence of the form 'So the answer is: <short answer>.'\n\n"
    "{docs}\n\nQuestion: {question}\n\nReasoning so far: {thoughts}\n\nWrite the next sentence only."
)

ITER_RETGEN = (
    "Answer the question with the help of the passages. Explain your reasoning in a few "
    "sentences, then finish with 'So the answer is: <short answer>.'\n\n{docs}\n\nQuestion: {question}"
)
