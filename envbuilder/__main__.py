"""`python -m envbuilder` runs the envbuild CLI."""

from envbuilder.cli.app import main

main()
