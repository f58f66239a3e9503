"""The rich console that kmp's tables print to."""


def make_console():
    """A rich console: the terminal's width, or 160 columns for logs and
    pipes (rich would otherwise squash tables to 80)."""
    from rich.console import Console

    console = Console()
    return console if console.is_terminal else Console(width=160)
