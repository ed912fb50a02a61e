"""The search environment and everything it stands on: corpus, encoders, index, retriever,
previews, the action protocol, SearchEnv, the batched env, rewards, metrics and QA data."""
