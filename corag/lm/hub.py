"""Model names that only a hub could give: refused at once where this machine cannot reach one.

The hub library would retry for about a minute and end in a traceback; a command checks its model and
tokenizer names first and says in one line what to give instead (a checkpoint folder, or the cache filled
by `corag models fetch` on a login node; a gated model's login step).
"""

from __future__ import annotations

import socket
from pathlib import Path
from urllib.parse import urlparse

from corag.errors import InputError

HUB_TIMEOUT_S = 3.0
# Hub organisations whose models need an accepted license and a login (Llama-3.1).
GATED_ORGS = ("meta-llama",)


def gated_hint(name: str) -> str:
    """The login step a gated model needs, or ''."""
    if name.split("/")[0] in GATED_ORGS:
        return (f" ({name} is gated: accept its license at https://huggingface.co/{name} and log in on the "
                "login node with `hf auth login` first)")  # fmt: skip
    return ""


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
        f"no such folder, not in the Hugging Face cache, and {why}: give a checkpoint folder, or fill the cache "
        f"({constants.HF_HUB_CACHE}) with `corag models fetch CONFIG` on a login node with internet first"
        f"{gated_hint(name)}",
        file=name,
        field=field,
    )
