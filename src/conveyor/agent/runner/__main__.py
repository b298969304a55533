"""`python -m conveyor.agent.runner`: the job runner (`entry.main`)."""

from conveyor.agent.runner.entry import main

if __name__ == "__main__":
    main()
