"""`SplitInference`: the hooks of split (ID-private) inference, and how a protocol describes them for export.

ID-private inference (`lvfl.inference.router`) splits a prediction in two: each passive party precomputes its
contribution for the IDs it holds (from its own features alone), the active party fetches it obliviously and
completes the prediction. A protocol supports it by overriding both hooks (`passive_contribution`,
`complete_prediction`); they must reproduce the active party's `party_logits` exactly under Plain aggregation
(tests check it). `lvfl export` writes `describe_combination` to party.json.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from typing import Any

import torch


class SplitInference:
    """Split-inference hooks a `VFLModule` inherits; a protocol that supports split inference overrides both.

    A plain mixin: it relies on these of `VFLModule` (`lvfl.protocols.base`): `aggregation` (its
    `combine_in_clear`), `party_models` (each with an `encoder`) and `private_head`.
    """

    def passive_contribution(self, party: str, features: torch.Tensor) -> torch.Tensor:
        """What passive `party` contributes to the prediction of samples with `features`: default, its embedding."""
        return self.party_models[party].encoder(features)

    def complete_prediction(
        self, active_features: torch.Tensor, contributions: Mapping[str, torch.Tensor]
    ) -> torch.Tensor:
        """The active party's logits from its own features and every passive party's contribution."""
        raise TypeError(
            f"{type(self).__name__} does not support split (ID-private) inference: it has no complete_prediction"
        )

    def describe_combination(self) -> dict[str, Any]:
        """How the two hooks above combine the parties' outputs, as JSON data (`lvfl export` writes it to party.json).

        An exported folder is served without lvfl, so its reader needs in words and numbers what each passive party
        sends (`contribution`) and what the active party computes from it (`combine`), with any values that enter
        (weights, the number of parties, which head). The default quotes the two hooks' docstrings, so a protocol
        that implements them exports with no extra code; built-in protocols override it with their formulas.

        Raises:
            TypeError: the protocol has no `complete_prediction` (named): there is no split prediction to describe.
        """
        name = type(self).__name__
        if type(self).complete_prediction is SplitInference.complete_prediction:
            raise TypeError(
                f"{name} does not support split (ID-private) inference: it has no complete_prediction, so its "
                "parties' outputs have no combination to export"
            )
        contribution = inspect.getdoc(type(self).passive_contribution) or ""
        combine = inspect.getdoc(type(self).complete_prediction) or ""
        return {
            "contribution": contribution.split("\n\n")[0].replace("\n", " "),
            "combine": combine.split("\n\n")[0].replace("\n", " "),
        }

    def reported_head(self, shared: str) -> str:
        """The head the active party reports (`active_prediction`): its private head, else the `shared` module.

        For `describe_combination`: with a label mechanism the release-trained `shared` head is not what lvfl scores.
        """
        if self.private_head is None:
            return shared
        return f"private_head (trained on the true labels; {shared}, trained on the label release, is not used)"

    def plain_sum(
        self, active: torch.Tensor, contributions: Mapping[str, torch.Tensor], order: Sequence[str]
    ) -> torch.Tensor:
        """`active + sum_k contributions[k]` in `order`, as the run's backend combines the shares.

        Plain's float sum, DHMasking's and Paillier's fixed-point rounding (`AggregationBackend.combine_in_clear`),
        so a completion from contributions in the clear equals the run's own prediction bit for bit.
        """
        return self.aggregation.combine_in_clear(active, contributions, order)
