"""The command lines: argument parsing and nothing else; each ``main`` calls the package
that does the work."""
