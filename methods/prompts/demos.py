"""One worked example per agent protocol, shown before the real question.

Small and base models follow a format far better when they have seen it once. The example is
our own (a two-hop question about Mozart), short, and written in exactly the tags the env reads.
"""

_QUESTION = "Which river flows through the city where the composer of The Magic Flute was born?"

_MAGIC_FLUTE = ("The Magic Flute is an opera in two acts by Wolfgang Amadeus Mozart to a German libretto by "
                "Emanuel Schikaneder, first performed in Vienna in 1791.")
_MOZART = ("Wolfgang Amadeus Mozart was a prolific and influential composer of the Classical period. He was born "
           "in Salzburg in 1756.")
_SALZBURG = "Salzburg is the fourth-largest city in Austria. It lies on both banks of the river Salzach."

PREFIX = f"""Question: {_QUESTION}
I need the composer first.
<search>composer of The Magic Flute</search>
<information>
[1] The Magic Flute
{_MAGIC_FLUTE}
</information>
The composer is Mozart. Now his birthplace and its river.
<search>Salzburg river</search>
<information>
[1] Salzburg
{_SALZBURG}
</information>
<answer>Salzach</answer>"""

DYNAMIC_K = f"""Question: {_QUESTION}
I need the composer first.
<search>composer of The Magic Flute</search>
<retrieved>10 passages found, ranked best first. How many of the top ones will you read?</retrieved>
<read>1</read>
<information>
[1] The Magic Flute
{_MAGIC_FLUTE}
</information>
The composer is Mozart. Now his birthplace and its river.
<search>Salzburg river</search>
<retrieved>10 passages found, ranked best first. How many of the top ones will you read?</retrieved>
<read>2</read>
<information>
[1] Salzburg
{_SALZBURG}

[2] Salzach
The Salzach is a river in Austria and Germany, flowing through Salzburg.
</information>
<answer>Salzach</answer>"""

PREVIEW = f"""Question: {_QUESTION}
I need the composer first.
<search>composer of The Magic Flute</search>
<snapshot>
[1] Opera: Opera is a form of theatre in which music is a fundamental component ...
[2] The Magic Flute: The Magic Flute is an opera in two acts by Wolfgang Amadeus Mozart ...
[3] Flute: The flute is a family of woodwind instruments ...
</snapshot>
Only candidate 2 is about the opera itself.
<expand>2</expand>
<information>
[2] The Magic Flute
{_MAGIC_FLUTE}
</information>
The composer is Mozart. I need his birthplace.
<search>Mozart birthplace</search>
<snapshot>
[1] Wolfgang Amadeus Mozart: ... He was born in Salzburg in 1756.
[2] Salzburg: ... It lies on both banks of the river Salzach.
[3] Vienna: Vienna is the capital of Austria ...
</snapshot>
Candidates 1 and 2 both help.
<expand>1, 2</expand>
<information>
[1] Wolfgang Amadeus Mozart
{_MOZART}

[2] Salzburg
{_SALZBURG}
</information>
<answer>Salzach</answer>"""

REASONING = f"""Question: {_QUESTION}
The opera's composer is needed first.
<search>composer of The Magic Flute</search>
<result>The Magic Flute is an opera by Wolfgang Amadeus Mozart.</result>
So the composer is Mozart. Where was he born, and which river flows there?
<search>Mozart birthplace river</search>
<result>Mozart was born in Salzburg, which lies on the river Salzach.</result>
<answer>Salzach</answer>"""

REASONING_PREVIEW = f"""Question: {_QUESTION}
The opera's composer is needed first.
<search>composer of The Magic Flute</search>
<snapshot>
[1] The Magic Flute: The Magic Flute is an opera in two acts by Wolfgang Amadeus Mozart ...
[2] Flute: The flute is a family of woodwind instruments ...
</snapshot>
<expand>1</expand>
<result>The Magic Flute is an opera by Wolfgang Amadeus Mozart.</result>
So the composer is Mozart. Where was he born, and which river flows there?
<search>Mozart birthplace river</search>
<snapshot>
[1] Wolfgang Amadeus Mozart: ... He was born in Salzburg in 1756.
[2] Salzburg: ... It lies on both banks of the river Salzach.
</snapshot>
<expand>1, 2</expand>
<result>Mozart was born in Salzburg, which lies on the river Salzach.</result>
<answer>Salzach</answer>"""


def with_example(instructions: str, example: str) -> str:
    """Instructions, then the worked example, then the real question (already in ``instructions``)."""
    head, sep, question = instructions.rpartition("Question: ")
    return f"{head}Here is an example of the format.\n\n{example}\n\nNow the real task.\n\n{sep}{question}"
