"""`python -m lvfl.bench` is `lvfl bench` (and how a cell's own process is started)."""

from lvfl.bench import main

if __name__ == "__main__":
    main()
