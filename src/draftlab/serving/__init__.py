"""Serving: the builtin HTTP server and engine, launching SGLang / vLLM / builtin servers, the HTTP client,
host checks and device selection."""
