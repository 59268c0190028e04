"""Model names that only a hub could give: refused at once where this machine cannot reach one.

The hub library would retry for about a minute and end in a traceback; a command checks its model and
tokenizer names first and says in one line what to give instead (a checkpoint folder).
"""

from __future__ import annotations

import socket
from pathlib import Path
from urllib.parse import urlparse

from corag.errors import InputError

HUB_TIMEOUT_S = 3.0


def check_model_source(name: str, field: str) -> None:
    """Refuse, in one line, a model that is not a local folder, not in the Hugging Face cache, and
    whose hub is out of reach (HF_HUB_OFFLINE set, or no connection within HUB_TIMEOUT_S)."""
    if Path(name).expanduser().exists():
        return
    from huggingface_hub import constants, try_to_load_from_cache

    try:
        if isinstance(try_to_load_from_cache(name, "config.json"), str):
            return
    except ValueError:  # not a valid hub name either
        raise InputError("no such folder, and not a hub model name", file=name, field=field) from None
    if constants.HF_HUB_OFFLINE:
        why = "HF_HUB_OFFLINE is set"
    else:
        endpoint = urlparse(constants.ENDPOINT)
        try:
            socket.create_connection((endpoint.hostname, endpoint.port or 443), HUB_TIMEOUT_S).close()
            return
        except OSError:
            why = f"{endpoint.hostname} cannot be reached"
    raise InputError(
        f"no such folder, not in the Hugging Face cache, and {why}: give a checkpoint folder",
        file=name,
        field=field,
    )
