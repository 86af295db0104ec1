"""Training: tokenization, hidden-state dumps, the builtin
trainer and the SpecForge backend (run config out, checkpoint in).

The builtin trainer is split by job: the CLI's ``train`` calls :func:`draftlab.training.train.train_drafter`,
which reads top to bottom through ``config``, ``features``, ``drafter_init``, ``loop`` (with ``loss`` and
``attention``), ``checkpoints``, ``resume``, ``metrics`` and ``distributed``.
"""
