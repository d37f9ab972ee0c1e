"""`python -m envbuilder` runs the envbuild CLI."""

from envbuilder.cli import main

main()
