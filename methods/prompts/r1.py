"""The exact prompts of the trained-policy protocols (Search-R1 and SEEDS-R1).

The trainer (training/) builds its episodes from these same strings, so a checkpoint trained
there is evaluated here on exactly the text it learned. They are raw text for base models: no
chat template.
"""

SEARCH_R1 = (
    "Solve the question below. Think inside <think> and </think> each time you receive new "
    "information. When you need knowledge you lack, query a search engine by writing <search> "
    "query </search>; the top results are returned inside <information> and </information>. "
    "Search as many times as you need. Once you know it, write only the answer inside <answer> "
    "and </answer>, for example <answer> Paris </answer>. Question: {question}\n"
)

SEEDS_R1 = (
    "Solve the question below. Think inside <think> and </think> each time you receive new "
    "information. When you need knowledge you lack, query a search engine by writing <search> "
    "query </search>; you get a <snapshot> with up to {k} numbered candidates, each a title and "
    "a short excerpt. After every snapshot you must pick which candidates to read in full by "
    "writing <expand> numbers </expand>, for example <expand> 1, 3 </expand>, or <expand> none "
    "</expand>; at most {max_expand} at a time. Their full text is returned inside <information> "
    "and </information>. You may search at most {max_searches} times. Once you know it, write "
    "only the answer inside <answer> and </answer>, for example <answer> Paris </answer>. "
    "Question: {question}\n"
)

# SEEDS-R1 with the judgement form of the expand action (``EnvConfig.expand_form = "judge"``):
# after a snapshot the policy judges every candidate in order, one yes/no each.
SEEDS_R1_JUDGE = (
    "Solve the question below. When you need knowledge you lack, query a search engine by writing "
    "<search> query </search>; you get a <snapshot> with up to {k} numbered candidates, each a title "
    "and a short excerpt. After every snapshot judge each candidate in order, yes to read it in full "
    "or no to skip it, inside <expand> and </expand>, for example <expand>[1] no [2] yes [3] no</expand>; "
    "at most {max_expand} yes at a time. The full text of the yes ones is returned inside <information> "
    "and </information>. You may search at most {max_searches} times. Once you know it, write only the "
    "answer inside <answer> and </answer>. Question: {question}\n"
)
