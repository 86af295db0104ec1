"""Serving: the builtin HTTP server (over :mod:`draftlab.engine`), launching SGLang / vLLM / builtin servers,
the one server description, what a running server says about itself, and host checks."""
