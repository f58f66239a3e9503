"""The examples, importable as `kmp.examples.<name>` (see pyproject)."""
