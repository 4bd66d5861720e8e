"""Write the bank / retailer example: two CSVs as two organisations would hold them.

    python examples/bank_retailer/make_data.py        # writes bank.csv and retailer.csv next to this file

The bank (the active party) holds 900 customers: `customer_id`, `income` (5% missing), `age`, `segment`
(categorical) and the label `status` ("default" / "ok"). The retailer holds 900 clients under its own ID column
`client`: `spend`, `visits`, `channel` (categorical). 604 IDs are shared; each file lists its rows in its own order.
The label depends on features of both parties, so that the federation has something to gain over the bank alone.
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

HERE = Path(__file__).parent


def main(out: Path = HERE, seed: int = 0) -> None:
    """Write `bank.csv` and `retailer.csv` into `out` (the same bytes for the same seed: the repository's files)."""
    rng = np.random.default_rng(seed)
    everyone = np.arange(1196)
    income = rng.normal(52, 14, len(everyone))
    age = rng.integers(19, 80, len(everyone))
    segment = rng.choice(["mass", "premium", "student"], len(everyone), p=[0.6, 0.25, 0.15])
    spend = rng.gamma(2.0, 0.8, len(everyone)) + (segment == "premium") * 1.5
    visits = rng.poisson(6, len(everyone))
    channel = rng.choice(["online", "store"], len(everyone))
    risk = -0.08 * (income - 52) + 0.9 * (spend - 1.6) - 0.15 * (visits - 6) + 0.6 * (segment == "student")
    status = np.where(risk + rng.normal(0, 0.8, len(everyone)) > 0.4, "default", "ok")
    ids = [f"CUST-{i:05d}" for i in everyone]

    bank_rows = rng.permutation(900)  # customers 0..899
    with (out / "bank.csv").open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["customer_id", "income", "age", "segment", "status"])
        for i in bank_rows:
            shown = "" if rng.random() < 0.05 else f"{income[i]:.2f}"
            writer.writerow([ids[i], shown, age[i], segment[i], status[i]])
    retail_rows = rng.permutation(np.arange(296, 1196))  # 604 of them are bank customers
    with (out / "retailer.csv").open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["client", "spend", "visits", "channel"])
        for i in retail_rows:
            writer.writerow([ids[i], f"{spend[i]:.2f}", visits[i], channel[i]])


if __name__ == "__main__":
    main()
