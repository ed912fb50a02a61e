"""Search-o1 style prompts: a reasoning agent with a search tool, a separate reader that
condenses retrieved documents ("reason in documents"), and SEEDS-o1's preview admission."""

REASONER = (
    "Work out the answer to the question by reasoning step by step. You have a Wikipedia search "
    "tool: whenever you need a fact you are not sure of, write <search>query</search> and stop. "
    "A reader will study the results and return what is relevant inside <result> … </result>; "
    "carry on reasoning from it. You can search at most {max_searches} times. End with the final "
    "reply as <answer>short answer</answer>.\n\nQuestion: {question}\n"
)

SEEDS_REASONER = (
    "Work out the answer to the question by reasoning step by step. You have a Wikipedia search "
    "tool: whenever you need a fact you are not sure of, write <search>query</search> and stop. "
    "You then see a <snapshot> of up to {k} candidates, one per line as [number] Title: short "
    "excerpt. Choose the candidates worth reading in full with <expand>numbers</expand> (or "
    "<expand>none</expand>) and stop. Be inclusive: open every candidate that might bear on the "
    "question, up to {max_expand}. A reader will study the opened passages and return what is "
    "relevant inside <result> … </result>; carry on reasoning from it. You can search at most "
    "{max_searches} times. End with the final reply as <answer>short answer</answer>.\n\n"
    "Question: {question}\n"
)

READER = (
    "You assist someone who is reasoning towards an answer. Below are their reasoning so far, "
    "the search query they just issued, and the documents it returned.\n\n"
    "Reasoning so far:\n{reasoning}\n\nSearch query: {query}\n\nDocuments:\n{docs}\n\n"
    "Pick out only the facts from the documents that help with this query and the reasoning, "
    "stated briefly. If the documents contain nothing useful, say: No useful information. "
    "Write your findings after the words 'Final Information:'."
)

READER_MARK = "Final Information:"
