"""Gateway benchmarks: overhead against calling the engine directly and against LiteLLM."""
