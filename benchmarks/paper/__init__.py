"""What a protocol learns or leaks: accuracy over seeds, ablations of a paper's setting, privacy budgets, attacks."""
