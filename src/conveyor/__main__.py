"""`python -m conveyor` runs the CLI (the scaler spawns agents this way, so a venv-only install works)."""

from conveyor.cli.main import main

main()
