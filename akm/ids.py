"""Random ids (UUID version 4 text) without `import uuid`.

`uuid` imports `platform` at import time, a couple of milliseconds that every `workflow run`
(run id, lease holder, guard token) would pay for one call to `uuid.uuid4()`.
"""

from __future__ import annotations

import os


def uuid4() -> str:
    """A random RFC 4122 version-4 UUID as `str(uuid.uuid4())` prints it."""
    b = bytearray(os.urandom(16))
    b[6] = (b[6] & 0x0F) | 0x40
    b[8] = (b[8] & 0x3F) | 0x80
    h = b.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
