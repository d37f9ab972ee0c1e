"""`python -m envbuilder.cli` runs the envbuild CLI."""

from envbuilder.cli import main

main()
