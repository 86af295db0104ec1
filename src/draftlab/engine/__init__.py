"""The builtin EAGLE-3 decode engine: one request (``core.Engine``), several rows together
(``batch_decode``), static slots with CUDA graphs (``static_decode``, its fused layers ``fused_llama`` and
``fused_drafter``, SGLang's draft trees ``draft_tree``), the continuous batcher (``scheduler``) and the
draft-token rule it shares with the server descriptions (``draft_shape``).

It knows nothing of servers: ``serving/`` imports it, never the reverse (tests/test_layers.py). Importing
this package loads no torch; its modules do.
"""
