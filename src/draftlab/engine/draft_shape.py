"""How many tokens a draft verifies: SGLang's rule for a chain (``topk`` 1) and a tree (``topk`` > 1).

Why here: the engine refuses a shape it cannot draft, and a server description (``serving.server_spec``)
refuses the same shape before anything launches; both read this one rule. No torch: the config check
runs on the CLI's light path.
"""

from __future__ import annotations


def most_tree_tokens(num_steps: int, topk: int) -> int:
    """Tokens a tree of ``num_steps`` x ``topk`` can verify: the pending token and every candidate draft (topk
    children of the root, then topk children of each of the topk beams per further step), as SGLang builds it."""
    return 1 + topk + (num_steps - 1) * topk * topk


def draft_tokens_problem(num_steps: int, topk: int, num_draft_tokens: int) -> str | None:
    """What is wrong with ``num_draft_tokens`` for ``num_steps`` x ``topk`` (None: nothing): a chain verifies
    ``num_steps + 1`` tokens, a tree 2 up to ``most_tree_tokens``. The config check and the engine's flags share it."""
    if topk == 1:
        if num_draft_tokens != num_steps + 1:
            return f"a chain (topk 1) verifies num_steps + 1 = {num_steps + 1} tokens, got {num_draft_tokens}"
        return None
    most = most_tree_tokens(num_steps, topk)
    if not 2 <= num_draft_tokens <= most:
        return f"a tree of {num_steps} steps x topk {topk} verifies 2..{most} tokens, got {num_draft_tokens}"
    return None
