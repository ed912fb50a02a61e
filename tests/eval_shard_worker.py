"""One process of a data-parallel evaluation in the tests (run by torchrun): the scripted LLM
of ``tests/test_methods.py`` stands in for the model."""
import sys

from fake_llm import FakeLLM
from test_methods import competent

from inference import evaluate

if __name__ == "__main__":
    evaluate.load_backend = lambda spec, **options: FakeLLM(competent)
    sys.exit(evaluate.main(sys.argv[1:]))
