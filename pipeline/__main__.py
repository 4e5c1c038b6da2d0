"""``python -m pipeline``: the same command line as the ``pipeline`` script.

Useful where the console script is not on ``PATH`` (tests run the CLI as a
subprocess with ``sys.executable -m pipeline``).
"""

from pipeline.cli import main

if __name__ == "__main__":
    main()
