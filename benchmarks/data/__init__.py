"""Data sets written from a registry's copy where their own site is out of reach, and the own-data path end to end."""
