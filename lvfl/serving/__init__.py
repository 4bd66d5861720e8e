"""Serving a fitted federation: each party's process answers from its own export folder and its own table.

- `export_folder`: a party's `lvfl export` folder as a serving process loads it (`ExportedParty`);
- `feature_source`: its table, encoded once, by ID, read again when its files change (`FeatureSource`);
- `membership`: which requested IDs a passive party holds, by ECDH-PSI on blinded points (`BlindedTable`,
  `Memberships`), so it never sees the active party's other customers;
- `metrics`: what a serving party counts for a Prometheus scraper (`ServingMetrics`);
- `contributions`: a passive party's service, its contributions for the active party's requests
  (`ContributionServer`);
- `scorer`: the active party's side, one prediction per requested ID from the passive parties' answers (`Scorer`);
- `api`: the active party's scoring API for its own applications, gRPC and HTTP/JSON on this machine;
- `client`: an application's client of that API (`ScoringClient`, `lvfl score --server`);
- `service`: the calls of serving.proto by name, and what a server and its clients agree on, so neither imports the
  other's module.

`lvfl serve` and `lvfl score` (`lvfl.commands`) run them; docs/serving.md says what each party learns.
"""

from lvfl.serving.contributions import ContributionServer
from lvfl.serving.export_folder import ExportedParty
from lvfl.serving.feature_source import FeatureSource
from lvfl.serving.scorer import ExportMismatch, Scored, Scorer

__all__ = ["ContributionServer", "ExportMismatch", "ExportedParty", "FeatureSource", "Scored", "Scorer"]
