"""Retrieval, in its own room: the corpus and its embedded default, encoders, the FAISS index
(build, memory planning, embedding files, exact re-ranking), the retriever, and the HTTP
retrieval server with its client (``RemoteRetriever``), and live web search (``WebRetriever``,
``web:`` specs). The env (``envs.search_env``) needs only
something with ``search(queries, k)``; see ``envs.search_env.RetrieverLike``."""
