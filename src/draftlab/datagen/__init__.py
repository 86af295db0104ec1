"""Data generation: prompts in, a target's answers out (``generate_data``), through a server or
transformers (``answerers``) into a resumable store (``answer_shards``). A layer of its own, after
serving in the layer order because it starts and talks to servers; training reads the files it
writes, never its code."""
