"""What a message a passive party receives *is*, as a protocol declares it (`VFLModule.passive_inbox`).

Why: an attack (`lvfl.attacks`) applies to a protocol by what the attacking party receives, not by the protocol's
name, and the tags alone do not say it (SplitNN's and EASTER's ``gradients`` are gradients of different things).
The declaration is public, as the protocol's code is: it tells an attacker nothing it could not read there.
"""

from __future__ import annotations

#: dloss/dR_k for a passive party's own prediction R_k (logits): EASTER, Agg_VFL
PREDICTION_GRADIENT = "prediction_gradient"
#: dloss/dE_k for a passive party's cut-layer embedding E_k under the active party's top model: SplitNN
EMBEDDING_GRADIENT = "embedding_gradient"
#: class labels or label rows (a label mechanism's release where one is configured): C_VFL per batch, PraVFed once
LABELS = "labels"
#: an aggregate of the parties' embeddings the active party sends down: EASTER's E, C_VFL's other parties' embeddings
GLOBAL_EMBEDDING = "global_embedding"
#: the active party's top model's parameters: C_VFL
TOP_MODEL = "top_model"
#: aggregation weights: PraVFed
WEIGHTS = "weights"
#: key agreement and set-up messages (public keys, the split): no sample's label or feature
SETUP = "setup"
#: a flag of the run's control flow (the best epoch so far): one bit an epoch, of validation metrics
CONTROL = "control"

KINDS = (PREDICTION_GRADIENT, EMBEDDING_GRADIENT, LABELS, GLOBAL_EMBEDDING, TOP_MODEL, WEIGHTS, SETUP, CONTROL)
