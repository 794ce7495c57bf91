"""The builders' errors in the words of the config: Python argument names become config keys.

``create_detr`` and ``create_vit`` name their arguments (``grid``, ``backbone_widths=(16, 32, 64)``,
``pe_kwargs``); a user of train.py sets config keys (``detr.grid``, ``detr.backbone_widths``,
``model.pe_kwargs``). A task passes its map ``{argument: key}`` and ``reword`` rewrites the message:

* ``name=value`` and a quoted ``'name'`` (missing or unexpected argument) become the key;
* an encoding's unknown setting (``encoding 'learned_abs': ... unexpected keyword argument
  'temperature'``) becomes the key of that encoding's settings (``model.pe_kwargs.temperature``);
* a missing argument that the config has a key for ends with what to set.

``check_encodings`` names the config key of an unknown encoding name before anything is built (the
registry's error knows the name, not which of ``model.pe``, ``detr.dec_pe``... gave it).
"""
from __future__ import annotations

import re


def reword(message: str, keys: dict[str, str], settings: dict[str, str] | None = None,
           hints: dict[str, str] | None = None) -> str:
    """``message`` with the arguments of ``keys`` named by their config keys.

    ``settings`` maps an encoding name to the key of its settings (``{"sine": "model.pe_kwargs"}``);
    ``hints`` adds a sentence for a key the rewritten message names.
    """
    found = re.match(r"encoding '([^']+)': ", message)
    kwargs_key = (settings or {}).get(found.group(1)) if found else None
    if kwargs_key:
        message = re.sub(r"unexpected keyword argument '(\w+)'",
                         lambda m: f"unexpected setting {kwargs_key}.{m.group(1)}", message)
    missing = [k for k in re.findall(r"missing \d+ required (?:keyword-only |positional )?arguments?: (.*?)(?:;|$)",
                                     message) for k in re.findall(r"'(\w+)'", k)]
    names = "|".join(sorted(map(re.escape, keys), key=len, reverse=True))
    if names:
        message = re.sub(rf"(?<![\w.'])({names})(?==)", lambda m: keys[m.group(1)], message)
        message = re.sub(rf"'({names})'", lambda m: repr(keys[m.group(1)]), message)
        message = re.sub(r"(?<![\w.])([a-z_]+\.[\w.]+)=\(([^()]*)\)", r"\1=[\2]", message)  # a config list
    todo = [keys[k] for k in missing if k in keys]
    if todo:
        message += "; set " + " and ".join(f"{k}=..." for k in todo) + " in the config or on the command line"
    extra = [h for k, h in (hints or {}).items() if k in message]
    return message + "".join(f" ({h})" for h in extra)


def check_encodings(names: dict[str, str | None]) -> None:
    """``{config key: encoding name or None}``: a ValueError naming the key of the first unknown name."""
    from vispe.registry import get

    for key, name in names.items():
        if name is None:
            continue
        try:
            get(name)
        except ValueError as e:
            raise ValueError(f"{key}={name!r}: {e}") from None
