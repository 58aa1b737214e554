"""Where evaluation results go: span enrichment, log events, Langfuse and Phoenix bridges."""
