"""Where the parties' sample IDs are aligned: private set intersection, and `PartyTables`' set-up messages around it.

- `intersection`: `private_intersection`, the entry to either PSI, and the ledger of its messages (`message_bytes`);
- `kkrt`: KKRT16's PSI, an oblivious PRF from OT extension (the default); `ecdh`: ECDH-PSI over Curve25519;
- `matching`: how either PSI ends, the active party matching values and the `<tag>/matches` message (`Alignment`);
- `parts`: a long PSI message in parts with read receipts;
- `setup_exchange`: `PartyTables`' other set-up messages (a key holder's counts, the task, the input columns).

The arithmetic (blinding, the oblivious PRF, the base OTs, the secret shuffle) is `lvfl.crypto`'s; these modules move
its values between parties on the `Wire`.
"""

from lvfl.alignment.intersection import (
    DEFAULT_PROTOCOL,
    PROTOCOLS,
    Alignment,
    id_text,
    message_bytes,
    private_intersection,
)

__all__ = ["DEFAULT_PROTOCOL", "PROTOCOLS", "Alignment", "id_text", "message_bytes", "private_intersection"]
