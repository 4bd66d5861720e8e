"""`python -m lvfl.commands.bench` is `lvfl bench` (and how a cell's own process is started)."""

from lvfl.commands.bench import main

if __name__ == "__main__":
    main()
