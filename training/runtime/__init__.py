"""Runtime plumbing: processes (DDP/DeepSpeed), CPU threads, and the run's inputs (env config, retriever, questions)."""
