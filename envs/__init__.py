"""The search environment and everything it stands on: corpus, encoders, index, retriever,
previews, the action protocol, SearchEnv, the batched env, rewards, metrics and QA data."""

import gymnasium as _gym

# gym.make("seeds_rl/Search-v0", retriever=..., dataset=..., config=...) builds a SearchEnv.
if "seeds_rl/Search-v0" not in _gym.registry:
    _gym.register(id="seeds_rl/Search-v0", entry_point="envs.search_env:SearchEnv")
