"""The online learner's claims on drained logs and their trained samples (docs/operations.md, "The claim ledger")."""

from __future__ import annotations

import json
import logging
import os
import shutil
import stat
from os import path

from mortal.features.mjai import is_int
from mortal.util.fsutil import TMP_SUFFIX, atomic_write_bytes, empty_dir, fsync_dir

logger = logging.getLogger('mortal.claims')  # the name before the package split (log format)

MANIFEST = "claims.json"
STAGED = "claims.json.next"  # the manifest of a checkpoint being written (commit_with)
_FORMAT = 1
_DONE = "done"
MAX_SAMPLES = 1 << 20  # samples of one pass over one log (a hanchan gives a few thousand): more is corrupt
# Entries of the claim folder that are not claimed logs: the manifest, the staged one and their temporary files.
_RESERVED = frozenset({MANIFEST, MANIFEST + TMP_SUFFIX, STAGED, STAGED + TMP_SUFFIX})


class _Partial:
    """A pass over one file with some of its ``total`` samples trained (``trained``: sample indices)."""

    __slots__ = ("total", "trained")

    def __init__(self, total: int, trained=()):
        self.total = int(total)
        self.trained = set(trained)


def _remaining(unit) -> int:
    return 0 if unit == _DONE else max(0, unit.total - len(unit.trained))


def is_plain_name(name) -> bool:
    """Whether ``name`` is a non-empty str naming a file inside a folder (no separator, NUL, '.' or '..')."""
    return isinstance(name, str) and name not in ("", ".", "..") and "\0" not in name and "/" not in name \
        and not (os.sep and os.sep in name) and not (os.altsep and os.altsep in name)


class ClaimLedger:
    """Training progress of the logs claimed into ``claim_dir``; start it with ``open`` or ``for_dataset``."""

    def __init__(self, claim_dir: str, *, signature: dict, passes: int):
        self.claim_dir = path.abspath(claim_dir)
        self.signature = dict(signature)
        self.passes = int(passes)
        self.files: dict[str, dict] = {}  # claimed name -> {pass: _Partial or _DONE}, live (this process)
        self.committed: dict[str, dict] = {}  # the manifest's 'files', as of the last commit
        self.steps = None  # the checkpoint step of the last commit (None: unknown, e.g. a commit without one)
        self.duplicates = 0
        self.lost_samples = 0
        self._epoch: list[str] = []
        self._seen: set = set()

    @classmethod
    def open(cls, claim_dir: str, *, signature: dict, passes: int, steps: int | None = None) -> "ClaimLedger":
        """The ledger of ``claim_dir`` (created) as its manifest left it; ``steps``: the checkpoint on disk."""
        ledger = cls(claim_dir, signature=signature, passes=passes)
        os.makedirs(ledger.claim_dir, exist_ok=True)
        manifest = path.join(ledger.claim_dir, MANIFEST)
        _reconcile(ledger.claim_dir, steps)
        if not path.exists(manifest):
            return ledger
        files, same, ledger.steps = _read_manifest(ledger, manifest)
        gone = []
        for name, passes_ in files.items():
            kind = ledger._name_problem(name)
            if kind == "missing":
                gone.append(name)
            elif kind:
                logger.warning("%s: ignoring entry %r (%s): never read, never removed", manifest, name, kind)
                continue
            units = _parse_units(manifest, name, passes_, ledger.passes, gone=kind == "missing") if same else {}
            if kind == "missing":
                ledger.lost_samples += sum(_remaining(u) for u in units.values())
            else:
                ledger.files[name] = units
        if gone:
            logger.warning("%d claimed logs listed in %s are gone (%s%s): their remaining samples are lost",
                           len(gone), manifest, ', '.join(gone[:3]), ', ...' if len(gone) > 3 else '')
        ledger.committed = {name: ledger._entry(units) for name, units in ledger.files.items()}
        ledger._write()
        return ledger

    @classmethod
    def for_dataset(cls, claim_dir: str, ds, version: int, steps: int | None = None) -> "ClaimLedger":
        """``open`` with the signature and passes of the learner's loader."""
        signature = {"version": version, "player_names": ["trainee"], "num_epochs": ds.num_epochs,
                     "enable_augmentation": ds.enable_augmentation, "augmented_first": ds.augmented_first}
        passes = ds.num_epochs * (2 if ds.enable_augmentation else 1)
        return cls.open(claim_dir, signature=signature, passes=passes, steps=steps)

    def _name_problem(self, name) -> str:
        """Why ``name`` cannot be a claimed log here ('' when it can), so nothing outside is touched."""
        if not is_plain_name(name):
            return "not a plain file name"
        if name in _RESERVED:
            return "a file of the ledger itself"
        try:
            st = os.lstat(path.join(self.claim_dir, name))
        except FileNotFoundError:
            return "missing"
        except (OSError, ValueError) as ex:
            return f"cannot be looked at: {ex}"
        if not stat.S_ISREG(st.st_mode):
            return "not a regular file (a symlink, folder or other)"
        return ""

    def _entry(self, units: dict) -> dict:
        return {str(p): _DONE if u == _DONE else {"total": u.total, "trained": sorted(u.trained)}
                for p, u in sorted(units.items())}

    def _write(self, files: dict | None = None, steps: int | None = None, name: str = MANIFEST) -> None:
        data = {"format": _FORMAT, "signature": self.signature, "passes": self.passes,
                "steps": self.steps if files is None else steps,
                "files": self.committed if files is None else files}
        atomic_write_bytes(json.dumps(data, separators=(",", ":")).encode("utf-8"), path.join(self.claim_dir, name))

    def names(self) -> set:
        """Names of the claimed logs the ledger still tracks (a new drain must keep them)."""
        return set(self.files)

    def add(self, names) -> None:
        """Track newly claimed logs; listed in the manifest before they are linked."""
        for name in names:
            self.files[name] = {}
            self.committed[name] = {}
        self._write()

    def claim(self, drain_dir: str, files) -> tuple:
        """Hard-link (else copy) each drained ``drain_dir/name`` into the claim folder (emptied but for the tracked
        logs; a clash becomes ``'<k>+<name>'``) and track it, listed before the link. Returns (claimed paths, names
        that vanished); OSError when a link fails."""
        keep = self.names() | _RESERVED
        empty_dir(self.claim_dir, keep)
        accepted, refused = [], []
        for name in files:  # the server's reply: a name with a separator would link outside both folders
            (accepted if is_plain_name(name) and name not in _RESERVED else refused).append(name)
        if refused:
            logger.warning("%d drained names refused (not plain log file names): %s", len(refused),
                           ", ".join(repr(n)[:80] for n in refused[:3]))
        files = accepted
        targets = []
        for name in files:  # drained names restart at "0_" with every server: one may meet a log kept from before
            target, k = name, 1
            while target in keep:
                target, k = f"{k}+{name}", k + 1
            targets.append(target)
            keep.add(target)
        self.add(targets)
        claimed, vanished = [], []
        for name, target in zip(files, targets):
            dst = path.join(self.claim_dir, target)
            try:
                _link_or_copy(path.join(drain_dir, name), dst)
            except FileNotFoundError:  # gone before the link: not tracked after all
                vanished.append(name)
                self.files.pop(target, None)
                self.committed.pop(target, None)
                continue
            claimed.append(dst)
        if vanished:
            self._write()
        return claimed, vanished

    def _done(self, units: dict) -> bool:
        return len(units) == self.passes and all(u == _DONE for u in units.values())

    def pending(self) -> list:
        """Paths of the tracked logs with samples left to train, in claim order."""
        return [path.join(self.claim_dir, n) for n, units in self.files.items() if not self._done(units)]

    def partly_trained(self) -> int:
        """How many of the ``pending`` logs have some samples trained already."""
        return sum(1 for units in self.files.values() if units and not self._done(units))

    def trained_map(self) -> dict:
        """``{path: {pass: indices or None}}`` of what is trained, for ``FileDatasetsIter(trained=...)``."""
        return {path.join(self.claim_dir, n): {p: None if u == _DONE else set(u.trained) for p, u in units.items()}
                for n, units in self.files.items() if units}

    def begin_epoch(self, paths) -> None:
        """The files of this epoch's loader, in the order its sample ids' ``file`` refers to."""
        # a path outside the claim folder is no claimed log (None: its samples are not tracked)
        self._epoch = [path.basename(p) if path.dirname(path.abspath(p)) == self.claim_dir else None
                       for p in paths]
        self._seen = set()

    def _rows(self, ids):
        rows = ids.tolist() if hasattr(ids, "tolist") else list(ids)
        for fid, pass_, index, total in rows:
            if self._epoch[fid] is not None:
                yield self._epoch[fid], int(pass_), int(index), int(total)

    def record(self, ids) -> None:
        """Mark the samples ``ids`` (``(B, 4)`` int64: file, pass, index, count) as trained."""
        for name, pass_, index, total in self._rows(ids):
            units = self.files.get(name)
            if units is None:
                self.duplicates += 1
                continue
            unit = units.get(pass_)
            if unit == _DONE or (unit is not None and index in unit.trained):
                self.duplicates += 1
                continue
            if unit is None:
                unit = units[pass_] = _Partial(total)
            unit.trained.add(index)
            self._seen.add((name, pass_))
            if len(unit.trained) >= unit.total:
                units[pass_] = _DONE

    def note_dropped(self, ids) -> None:
        """Samples the epoch's end left untrained (``iter_full_batches``' remainder): they stay in the resume set."""
        for name, pass_, _, total in self._rows(ids):
            units = self.files.get(name)
            if units is not None and units.get(pass_) is None:
                units[pass_] = _Partial(total)
            self._seen.add((name, pass_))

    def end_epoch(self) -> int:
        """After the loader's end: passes that yielded nothing are done; returns the samples lost since."""
        lost, self.lost_samples = self.lost_samples, 0
        for name in dict.fromkeys(self._epoch):
            units = self.files.get(name)
            if units is None:
                continue
            for p in range(self.passes):
                unit = units.get(p)
                if unit == _DONE or (name, p) in self._seen:
                    continue
                lost += _remaining(unit) if unit is not None else 0
                units[p] = _DONE
        return lost

    def commit_with(self, steps: int, save) -> int:
        """Persist the progress in one step with the checkpoint ``save()`` writes at ``steps`` (staged, saved,
        renamed); nothing is committed when ``save()`` raises. Returns how many trained logs were unlinked."""
        finished = [n for n, units in self.files.items() if self._done(units)]
        files = {name: self._entry(units) for name, units in self.files.items() if name not in finished}
        staged = path.join(self.claim_dir, STAGED)
        self._write(files, steps, STAGED)
        try:
            save()
        except Exception:
            try:
                os.remove(staged)
            except OSError:
                pass
            raise
        os.replace(staged, path.join(self.claim_dir, MANIFEST))
        fsync_dir(self.claim_dir)
        self.steps = steps
        for name in finished:
            del self.files[name]
        self.committed = files
        for name in finished:  # after the manifest: a crash before the unlinks leaves unlisted links, which the
            if self._name_problem(name):  # next claim removes; never unlink anything but a plain file of the folder
                continue
            try:
                os.remove(path.join(self.claim_dir, name))
            except FileNotFoundError:
                pass
        return len(finished)


def _reconcile(claim_dir: str, steps) -> None:
    """Adopt a staged manifest whose steps are ``steps`` (the checkpoint on disk), else remove it; logged."""
    staged, manifest = path.join(claim_dir, STAGED), path.join(claim_dir, MANIFEST)
    if not path.lexists(staged):
        return
    if path.islink(staged) or not path.isfile(staged):
        # a damaged ledger never stops the learner: what is no staged file (a folder, a link) is dropped
        try:
            shutil.rmtree(staged) if path.isdir(staged) and not path.islink(staged) else os.remove(staged)
            logger.warning("dropping %s: it is no staged claim ledger (a folder or a link)", staged)
        except OSError as ex:
            logger.warning("cannot drop %s, which is no staged claim ledger: %s", staged, ex)
        return
    try:
        with open(staged, encoding="utf-8") as f:
            at = json.load(f).get("steps")
    except (OSError, ValueError, AttributeError, RecursionError):
        at = None
    at = at if is_int(at) else None
    if steps is not None and at == steps:
        os.replace(staged, manifest)
        fsync_dir(claim_dir)
        logger.warning("the checkpoint of step %d was written but its learner stopped before the claim ledger's "
                       "commit: committing the ledger of that step now", steps)
    else:
        os.remove(staged)
        logger.info("dropping the claim ledger staged for step %s: the checkpoint on disk is of step %s (the "
                    "learner stopped before that checkpoint was written)", at, steps)


def _read_manifest(ledger: ClaimLedger, manifest: str) -> tuple:
    """``(files, same signature, steps)`` of the manifest; an unreadable one lists every plain file, untrained."""
    try:
        with open(manifest, encoding="utf-8") as f:
            data = json.load(f)
        files = data["files"]
        if data.get("format") != _FORMAT:
            raise ValueError(f"unknown format {data.get('format')!r}")
        if not isinstance(files, dict):
            raise ValueError(f"'files' is a {type(files).__name__}, expected an object")
        same = data.get("signature") == ledger.signature and data.get("passes") == ledger.passes
        steps = data.get("steps") if is_int(data.get("steps")) else None
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError) as ex:
        logger.warning("unreadable %s (%s: %s): the logs in %s are resumed whole", manifest,
                       type(ex).__name__, ex, ledger.claim_dir)
        files = {n: {} for n in sorted(os.listdir(ledger.claim_dir))
                 if not ledger._name_problem(n)}
        same, steps = True, None
    if not same:
        logger.warning("%s was written under other settings (%s, %r passes; now %s, %d passes): its %d "
                       "logs are resumed whole", manifest, data.get("signature"), data.get("passes"),
                       ledger.signature, ledger.passes, len(files))
    return files, same, steps


def _parse_units(manifest: str, name: str, passes_, n_passes: int, *, gone: bool = False) -> dict:
    """The ``{pass: _Partial or _DONE}`` of a manifest entry; a malformed one is logged once and resumed whole."""
    def bad(why):
        text = repr(passes_)
        logger.warning("%s: malformed entry for %r (%s: %s): %s", manifest, name, why,
                       text if len(text) <= 200 else text[:200] + "...",
                       "its remaining samples are unknown" if gone else "that log is resumed whole")
        return {}
    if not isinstance(passes_, dict):
        return bad(f"a {type(passes_).__name__}, expected an object")
    units, valid = {}, {str(p) for p in range(n_passes)}
    for key, value in passes_.items():
        if key not in valid:
            return bad(f"pass {key!r} is not one of 0..{n_passes - 1}")
        p = int(key)
        if value == _DONE:
            units[p] = _DONE
            continue
        if not isinstance(value, dict):
            return bad(f"pass {key}: a {type(value).__name__}, expected 'done' or an object")
        total, trained = value.get("total"), value.get("trained")
        if not is_int(total) or not 1 <= total <= MAX_SAMPLES:
            return bad(f"pass {key}: total {total!r} is not an integer 1..{MAX_SAMPLES}")
        if not isinstance(trained, list) or not all(is_int(i) and 0 <= i < total for i in trained):
            return bad(f"pass {key}: trained must be a list of indices 0..{total - 1}")
        units[p] = _Partial(total, trained) if len(set(trained)) < total else _DONE
    return units


def claim_dir_for(drain_dir: str) -> str:
    """The learner's own directory next to the server's ``drain_dir``: ``<drain_dir>.trainer``."""
    return path.normpath(drain_dir) + ".trainer"


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except FileNotFoundError:
        raise
    except OSError:  # EXDEV, EPERM, a file system without hard links: a copy (same bytes, more disk)
        shutil.copyfile(src, dst)


def staleness(drain_reply: dict) -> list:
    """Parameter versions (ints >= 0) between each drained log's and the server's; unknown ones left out."""
    current, versions = drain_reply.get("param_version", 0), drain_reply.get("param_versions", [])
    if not is_int(current) or not isinstance(versions, list):  # the server's reply: never trusted to be well-formed
        return []
    return [current - v for v in versions if is_int(v) and v >= 0]
