"""Label mechanisms: how the active party's labels are protected when anything derived from them leaves it.

`mechanisms`: the epsilon-label-DP mechanisms (`LaplaceLabels`, `RandomizedResponse`, on `LabelMechanism`), the
noise they draw and the `PrivacyLedger` of the epsilon spent; `release`: `LabelRelease`, a run's one draw of
protected training labels, looked up by sample ID and checkpointed.
"""

from lvfl.privacy.labels.mechanisms import LabelMechanism, LaplaceLabels, PrivacyLedger, RandomizedResponse
from lvfl.privacy.labels.release import LabelRelease

__all__ = ["LabelMechanism", "LabelRelease", "LaplaceLabels", "PrivacyLedger", "RandomizedResponse"]
