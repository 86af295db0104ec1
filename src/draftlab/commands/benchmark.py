"""CLI commands of this area (placeholder until the area's commands land)."""


def register(sub) -> None:
    """Add this area's subcommands to the draftlab parser."""
