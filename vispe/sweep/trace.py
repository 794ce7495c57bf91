"""What a run used: the repository files of every module train.py imported, and its config, with their git blob
hashes, written at exit to ``<run folder>/imports.json``. The sweep runs train.py through ``WRAPPER``
(``traced``); collect.py carries the hashes into the results' ``<name>_code.json``, so that
results/compare/freshness.py judges those rows by the files they used, not by the whole package.

``imports.json``: ``{"files": {path: blob hash}, "edited": [path, ...]}``; paths relative to the repository
(train.py's folder), ``.venv`` left out; ``edited``: files whose modification time is after the run started
or whose hash differs from an earlier, interrupted part of the same run, or a note that an earlier part ended
without its record (killed): the hashes read at exit may not be the code that ran, so freshness then falls back
to the whole package.
"""
from __future__ import annotations

import json
from pathlib import Path

ENV = "VISPE_IMPORTS"  # where the wrapper writes imports.json
FILE = "imports.json"

#: ``python -c WRAPPER train.py ARGS``: runs train.py as ``__main__`` and at exit writes imports.json to $VISPE_IMPORTS
WRAPPER = """import atexit, hashlib, json, os, runpy, sys, time
_start, _script = time.time(), os.path.abspath(sys.argv[1])
_root, _out = os.path.dirname(_script), os.environ['VISPE_IMPORTS']
try:  # an earlier part of this run (resumed): its record, or the marker it left if it ended without one
    _before = json.load(open(_out))
except (OSError, ValueError):
    _before = None
with open(_out, 'w') as f:  # stays only if this part ends without its record (SIGKILL): the next part sees it
    json.dump({'files': {}, 'edited': ['(a part of this run ended without recording its files)']}, f)
def _dump():
    files, edited = {}, []
    paths = {os.path.abspath(str(getattr(m, '__file__', None) or '')) for m in list(sys.modules.values())}
    paths |= {_script} | {os.path.abspath(a) for a in sys.argv[1:] if a.endswith('.yaml') and os.path.isfile(a)}
    for f in sorted(paths):
        rel = os.path.relpath(f, _root)
        if not os.path.isfile(f) or rel.startswith('..') or rel.split(os.sep)[0] == '.venv':
            continue
        data = open(f, 'rb').read()
        files[rel.replace(os.sep, '/')] = hashlib.sha1(b'blob %d\\0' % len(data) + data).hexdigest()
        if os.path.getmtime(f) > _start:
            edited.append(rel.replace(os.sep, '/'))
    if _before is not None:  # a resumed run: a file whose hash differs from the earlier part's is edited too
        old = _before.get('files', {})
        edited.extend(sorted(set(_before.get('edited', [])) | {p for p, h in old.items() if files.get(p) != h}))
    with open(_out, 'w') as out:
        json.dump({'files': files, 'edited': edited}, out, indent=0)
atexit.register(_dump)
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name='__main__')
"""


def traced(argv: list[str], folder: Path) -> tuple[list[str], dict[str, str]]:
    """``argv`` (``[python, train.py, ...]``) run through ``WRAPPER``, and the environment that names
    ``<folder>/imports.json``."""
    return [argv[0], "-c", WRAPPER, *argv[1:]], {ENV: str(Path(folder) / FILE)}


def read(folder: Path) -> dict[str, str] | None:
    """The hashes a finished run recorded, or None: none recorded (a run of an older version, or not through the
    sweep) or a file edited while it ran."""
    try:
        rec = json.loads((Path(folder) / FILE).read_text())
    except (OSError, ValueError):
        return None
    return None if rec.get("edited") or not rec.get("files") else dict(rec["files"])


CONFLICT = "conflict"  # two runs of one commit recorded different content for a path (runs from uncommitted changes)


def by_commit(sweep_dir: Path, df) -> dict[str, dict[str, str] | None]:
    """The files the finished runs of ``df`` (collect.py's table of ``sweep_dir``) used, per commit: the union of
    their records; None for a commit with a finished run that recorded none (then nothing narrower is known)."""
    out: dict[str, dict[str, str] | None] = {}
    fin = df[df["status"] == "finished"].drop_duplicates("run") if len(df) else df
    for run, commit in zip(fin["run"], fin["commit"].astype(str)):
        files = read(Path(sweep_dir) / run)
        if files is None or (commit in out and out[commit] is None):
            out[commit] = None
            continue
        have = out.setdefault(commit, {})
        assert have is not None
        for p, h in files.items():
            have[p] = h if have.get(p, h) == h else CONFLICT
    return out


def merge(kept: dict, fresh: dict) -> dict:
    """A committed ``<name>_code.json`` (``kept``) updated with a sweep folder's (``fresh``): a commit both
    know is traced only when both traced it, with the union of the files (a path they disagree on: CONFLICT)."""
    out = dict(kept)
    for c, files in fresh.items():
        if c not in out:
            out[c] = files
        elif out[c] is None or files is None:
            out[c] = None
        else:
            out[c] = {**out[c], **{p: h if out[c].get(p, h) == h else CONFLICT for p, h in files.items()}}
    return out
