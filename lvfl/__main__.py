"""`python -m lvfl` is the same as the `lvfl` console script."""

from lvfl.commands.entry import main

if __name__ == "__main__":
    main()
