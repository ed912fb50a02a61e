"""Evidence admission for the prompted iterative methods (SEEK, KAIR, MAPS with admission="preview"):
the model sees short previews of the candidates and names the ones worth reading in full."""

SELECT = (
    "You are collecting evidence to answer a question. A search returned the candidates below, "
    "each shown as [number] Title: short excerpt. Decide which of them are worth reading in "
    "full for the current purpose; open every candidate that might help, skip the ones that "
    "clearly cannot.\n\nQuestion: {question}\nCurrent purpose: {purpose}\n\nCandidates:\n{candidates}\n\n"
    "Reply with the numbers to open, separated by commas (for example: 1, 3), or the word none."
)
