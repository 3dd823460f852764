"""A runs store shared by workspaces, machines and sites, addressed by a URL: a path (a local
folder or a shared filesystem), or an object store or remote host through fsspec, the library
DVC itself uses (``s3://``, ``gs://``, ``az://``, ``ssh://``, ... with the matching fsspec
package installed: s3fs, gcsfs, adlfs, sshfs).

Layout under the URL: ``<run_id>/<files>`` and ``<run_id>/manifest.json``, which lists every
file with its sha256 and size. Publishing uploads the files, confirms each one (the stored
object's size, and its checksum read back: S3's ETag where it is the MD5 of what was sent, else
the object's bytes rehashed), and writes the manifest last, in one atomic step: under a
temporary name, then renamed (a path, SSH), or in one PUT, conditional on S3 (object stores show
an object whole or not at all). A run whose upload was interrupted has no manifest and is never
seen as complete. After the commit the publish looks at every file once more: one gone meanwhile
withdraws the manifest and is uploaded again, so no run stays listed with files missing
(``cse store push`` uploads again those a listed run lost). Fetching copies into a temporary,
checks every file against the manifest and renames it into the local runs folder only then.
Each file's transfer and the manifest are tried again after a transient error (a 5xx,
throttling, a connection reset, a timeout) with bounded exponential backoff (``StoreSettings``,
params' ``store:``); when the attempts run out, one ``StoreError`` names the run and the store,
and nothing half-done is visible.

One writer per run across workspaces: a lease object ``<run_id>.lease`` (holder, token, expiry,
purpose), renewed while held: by a trainer (training, then publishing), by a publish of ``cse
store push``, and by ``cse store gc`` while it deletes the run or what an upload of it left, so
that gc never deletes the files of a publish under way. Object stores have no portable atomic
create, so a holder writes its lease, waits ``LEASE_SETTLE_S`` and reads it back: only the
writer whose token survived goes on. A lease held by a dead process of this machine
(``run_lock.machine``) is taken over at once; one of another machine lapses ``LEASE_S`` after
its last renewal, measured by the store's own clock (the lease object's modification time
against that of a probe object written now), so hosts whose clocks differ neither take a live
lease nor wait for a dead one forever. A store that reports no modification times falls back on
the holder's expiry plus ``LEASE_SKEW_S``.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext, suppress
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from stages.core.errors import StageError
from stages.core.storage.atomic import (
    HOST_TAG,
    rename_durably,
    sync_folder,
    sync_tree,
    temporary_beside,
)
from stages.core.storage.hashing import CHUNK, sha256_of
from stages.core.storage.run_lock import RunLocked, held_on_this_host, machine, process_exists

MANIFEST = "manifest.json"
ORIGIN = "origin.json"  # local only: where the run came from (not part of the run's files)
LEASE_S = 600.0
LEASE_RENEW_S = 60.0
LEASE_SETTLE_S = 1.0
# Where the store gives no modification times: how far two hosts' clocks may differ.
LEASE_SKEW_S = 300.0
# S3 multipart part size (s3fs's default); files of two parts or more go up in parts.
S3_PART_BYTES = 50 * 2**20
LEFTOVER_AGE_S = 24 * 3600.0  # `cse store gc`'s default --older-than


# The URL schemes of the stores the leases and uploads are meant for (fsspec's names; aliases
# included). Others fsspec may know (ftp://, http://) cannot hold a lease or are not stores.
STORE_SCHEMES = ("file", "s3", "gs", "gcs", "az", "abfs", "ssh", "sftp")
OBJECT_STORES = ("s3", "s3a", "gs", "gcs", "az", "abfs", "abfss")

T = TypeVar("T")


class StoreError(StageError):
    """The store cannot be read or holds a damaged run."""


@dataclass(frozen=True)
class StoreSettings:
    """How hard a transfer tries (params' ``store:`` section has the same keys)."""

    retries: int = 5  # attempts after the first, per file and for the manifest
    backoff_s: float = 1.0  # the first wait; doubled after each failure
    max_backoff_s: float = 30.0  # no wait longer than this
    timeout_s: float = 60.0  # S3: connect and read timeout of each request


class _NotConfirmed(Exception):
    """A transfer that raised nothing but whose result is not what was sent (transient)."""


class _Exhausted(Exception):
    def __init__(self, what: str, attempts: int, err: BaseException) -> None:
        super().__init__(f"{what}: {err or type(err).__name__} ({attempts} attempt(s))")
        self.what, self.attempts, self.err = what, attempts, err


_PERMANENT_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES}


# Where the errors of a store's network come from (beyond OSError: resets, timeouts, 5xx).
_NETWORK_LIBRARIES = {
    *("botocore", "aiobotocore", "aiohttp", "s3fs", "gcsfs", "adlfs", "azure", "google"),
    *("sshfs", "asyncssh", "paramiko", "fsspec", "urllib3", "requests"),
}


def _transient(err: BaseException) -> bool:
    """Whether trying again may help: a network or server error, or a transfer that did not
    arrive whole; not a missing object, a refusal, a full local disk, or a bug."""
    permanent = FileNotFoundError | FileExistsError | PermissionError | IsADirectoryError
    if isinstance(err, permanent | StageError):
        return False
    if isinstance(err, OSError):
        return err.errno not in _PERMANENT_ERRNOS
    return isinstance(err, _NotConfirmed) or any(
        cls.__module__.split(".")[0] in _NETWORK_LIBRARIES for cls in type(err).__mro__
    )


def url_problem(url: str) -> str | None:
    """What is wrong with a store URL (a path, or ``<scheme>://...`` of ``STORE_SCHEMES``)."""
    scheme, separator, _ = url.partition("://")
    if not separator or scheme in STORE_SCHEMES:
        return None
    return (
        f"unsupported scheme '{scheme}://'; use a path or one of "
        f"{', '.join(f'{s}://' for s in STORE_SCHEMES)}"
    )


def run_files(folder: Path) -> list[str]:
    """Every file of a run folder, relative, sorted (the local origin note left out)."""
    return sorted(
        p.relative_to(folder).as_posix()
        for p in folder.rglob("*")
        if p.is_file() and p.relative_to(folder).as_posix() != ORIGIN
    )


def read_origin(folder: Path) -> dict[str, Any]:
    try:
        return json.loads((folder / ORIGIN).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def write_origin(folder: Path, origin: dict[str, Any]) -> None:
    (folder / ORIGIN).write_text(json.dumps(origin, sort_keys=True), encoding="utf-8")


def _local_digests(path: Path, part: int) -> dict[str, Any]:
    """sha256 and size of a local file, and the ETag S3 gives it uploaded in ``part``-byte
    parts (one PUT below two parts: the MD5; else the MD5 of the parts' MD5s, ``-N``)."""
    sha, whole, parts, size = hashlib.sha256(), hashlib.md5(), [], 0
    with path.open("rb") as f:
        while block := f.read(part):
            sha.update(block)
            whole.update(block)
            parts.append(hashlib.md5(block).digest())
            size += len(block)
    multipart = size >= 2 * part
    etag = (
        f"{hashlib.md5(b''.join(parts)).hexdigest()}-{len(parts)}"
        if multipart
        else whole.hexdigest()
    )
    return {"sha256": sha.hexdigest(), "size": size, "etag": etag}


def _mtime(info: dict[str, Any]) -> float | None:
    """An object's modification time, by the store's clock, from fsspec's ``info``."""
    for key in ("mtime", "LastModified", "last_modified", "updated", "modified", "created"):
        value = info.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, datetime):
            return value.timestamp()
        if isinstance(value, str):
            with suppress(ValueError):
                return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    return None


@dataclass(frozen=True)
class Leftover:
    """Something in the store that no complete run owns: a lease, a temporary, the files of an
    upload that never reached its manifest, an S3 multipart upload never completed."""

    path: str
    what: str
    age_s: float | None  # by the store's clock; None where it reports no times
    # a live lease covers it (a lease not lapsed; the files of a run whose lease is held, a
    # publish under way): never removed, whatever its age
    held: bool = False
    upload_id: str | None = None  # S3 multipart uploads
    run_id: str | None = None  # the files of an upload of this run, without a manifest


class SharedStore:
    def __init__(self, url: str, settings: StoreSettings | None = None) -> None:
        import fsspec  # light, but only needed when a store is configured

        self.url = url.rstrip("/")
        self.settings = settings or StoreSettings()
        problem = url_problem(self.url)
        if problem:
            raise StoreError(f"runs store {self.url}: {problem}")
        scheme = self.url.partition("://")[0] if "://" in self.url else "file"
        options: dict[str, Any] = {}
        if scheme in ("s3", "s3a"):  # one place retries: this class, with its backoff
            timeout = self.settings.timeout_s
            options = {
                "skip_instance_cache": True,
                "config_kwargs": {"connect_timeout": timeout, "read_timeout": timeout,
                                  "retries": {"total_max_attempts": 1, "mode": "standard"}},
            }  # fmt: skip
        try:
            self.fs, root = fsspec.core.url_to_fs(self.url, **options)
        except (ImportError, ValueError) as err:
            raise StoreError(f"runs store {self.url}: {err}") from None
        if options:
            self.fs.retries = 1  # s3fs's own loop: one try
        self.root = root.rstrip("/")
        self.scheme = scheme
        self.clock: Callable[[], float] = time.time  # this host's clock (tests shift it)
        self.retried: list[str] = []  # each transient error survived, in order
        self.leased: set[str] = set()  # the runs whose lease this object holds now

    def _path(self, *parts: str) -> str:
        return "/".join([self.root, *parts])

    @property
    def object_store(self) -> bool:
        """S3, GCS, Azure: no rename, but an object written in one PUT appears whole or not."""
        return self.scheme in OBJECT_STORES

    def _attempts(self, what: str, action: Callable[[], T]) -> T:
        """``action``, tried again after a transient error with exponential backoff."""
        settings = self.settings
        attempt = 0
        while True:
            try:
                return action()
            except Exception as err:
                attempt += 1
                if not _transient(err) or attempt > settings.retries:
                    raise _Exhausted(what, attempt, err) from err
                self.retried.append(f"{what}: {type(err).__name__}: {err}")
                time.sleep(min(settings.backoff_s * 2 ** (attempt - 1), settings.max_backoff_s))

    def manifest(self, run_id: str) -> dict[str, Any] | None:
        """The run's manifest, or None when the store has no complete copy of it."""
        try:
            text = self._attempts(
                f"{run_id}/{MANIFEST}", lambda: self.fs.cat_file(self._path(run_id, MANIFEST))
            )
        except _Exhausted as failed:
            if isinstance(failed.err, FileNotFoundError):
                return None
            raise StoreError(f"runs store {self.url}: cannot read {failed}") from None
        try:
            return json.loads(text)
        except ValueError as err:
            raise StoreError(f"{self.url}/{run_id}/{MANIFEST}: unreadable ({err})") from None

    def run_ids(self) -> list[str]:
        """Every run with a manifest (complete) in the store."""
        if not self.fs.exists(self.root):
            return []
        ids = []
        for entry in self.fs.ls(self.root, detail=False):
            name = entry.rstrip("/").rsplit("/", 1)[-1]
            if self.fs.exists(self._path(name, MANIFEST)):
                ids.append(name)
        return sorted(ids)

    def fetch(self, run_id: str, dest: Path) -> None:
        """Copy a complete run into ``dest``, every file checked.

        Each fetch copies into a temporary of its own process and renames it into place; when
        another fetch of the same run (a parallel job of the workspace) got there first, its
        copy stands and this one is dropped, so no fetch ever disturbs another's files."""
        manifest = self.manifest(run_id)
        if manifest is None:
            raise StoreError(f"{self.url}: has no complete run {run_id}")
        with temporary_beside(dest) as tmp:
            staging = tmp / dest.name
            try:
                for rel, meta in manifest["files"].items():
                    target = staging / rel
                    target.parent.mkdir(parents=True, exist_ok=True)
                    self._attempts(rel, partial(self._download, run_id, rel, meta, target))
            except _Exhausted as failed:
                missing = isinstance(failed.err, FileNotFoundError)
                raise StoreError(
                    f"run {run_id}: fetching it from {self.url} failed at {failed}"
                    + ("; the store's copy lacks that file (`cse store verify`)" if missing
                       else f"; retried with backoff (store.retries: {self.settings.retries})")
                    + f"; nothing of it was kept in {dest.parent}: rerun to fetch it again"
                ) from None  # fmt: skip
            write_origin(staging, {"origin": "fetched", "store": self.url,
                                   "published": manifest.get("published")})  # fmt: skip
            try:
                rename_durably(staging, dest)  # fails where dest is a folder holding files
            except OSError:
                if not all((dest / rel).is_file() for rel in manifest["files"]):
                    raise

    def _download(self, run_id: str, rel: str, meta: dict[str, Any], target: Path) -> None:
        self.fs.get_file(self._path(run_id, rel), str(target))
        size = target.stat().st_size
        if "size" in meta and size != meta["size"]:  # cut short (or grown) in transit
            raise _NotConfirmed(f"got {size} bytes of {meta['size']}")
        actual = sha256_of(target)
        if actual != meta["sha256"]:
            raise StoreError(
                f"{self.url}/{run_id}/{rel}: sha256 {actual}, its manifest says "
                f"{meta['sha256']}: the store's copy is damaged and was not used "
                f"(`cse store verify` lists every damaged run)"
            )

    def publish(self, run_id: str, folder: Path, experiment: str) -> None:
        """Upload a complete local run: its files, each confirmed, then the manifest (the
        commit point), then every file confirmed still there. Files already stored and
        confirmed (an interrupted publish) are kept. Holds the run's lease throughout (taken
        here unless this object holds it already: a trainer publishing what it trained), so
        that `cse store gc` leaves the files alone; a file gone after the commit all the same
        withdraws the manifest, and the files are uploaded again."""
        part = S3_PART_BYTES
        local = {rel: _local_digests(folder / rel, part) for rel in run_files(folder)}
        files = {rel: {"sha256": d["sha256"], "size": d["size"]} for rel, d in local.items()}
        manifest = {"run_id": run_id, "experiment": experiment, "files": files,
                    "published": time.time(), "host": socket.gethostname()}  # fmt: skip
        leased = run_id in self.leased
        with nullcontext() if leased else self.lease(run_id, experiment, "published"):
            missing: list[str] = []
            for _ in range(self.settings.retries + 1):
                missing = self._publish_once(run_id, folder, experiment, local, manifest)
                if not missing:
                    return
                self.retried.append(f"{run_id}: gone after the commit: {', '.join(missing)}")
        raise StoreError(
            f"run {run_id} ({experiment}): publishing it to {self.url} failed: after each of "
            f"{self.settings.retries + 1} commit(s) of its manifest, files of it were not in the "
            f"store ({', '.join(missing)}); the manifest was withdrawn, so no workspace sees it "
            "as published (does something delete from the store without honouring the run's "
            "lease?); `cse store push` publishes it"
        )

    def _publish_once(
        self,
        run_id: str,
        folder: Path,
        experiment: str,
        local: dict[str, dict[str, Any]],
        manifest: dict[str, Any],
    ) -> list[str]:
        """Upload what the store lacks, commit the manifest, and confirm every file is still
        there; the files that were not (the manifest then withdrawn), [] when published."""
        try:
            for rel, digests in local.items():
                self._attempts(rel, partial(self._upload, run_id, rel, folder / rel, digests))
            if self.on_this_machine:  # the files on the disk before the commit point (a crash)
                sync_tree(Path(self._path(run_id)))
            self._attempts(MANIFEST, lambda: self._commit(run_id, manifest))
        except _Exhausted as failed:
            raise StoreError(
                f"run {run_id} ({experiment}): publishing it to {self.url} failed at {failed}; "
                "it has no manifest there, so no workspace sees it as published; `cse store "
                "push` publishes it (the files already stored and confirmed are kept)"
            ) from None
        try:
            missing = self.missing_files(run_id, manifest["files"])
        except StoreError as unconfirmed:
            missing = [f"not confirmed: {unconfirmed}"]
        if missing:
            try:
                self._attempts(MANIFEST, lambda: self._withdraw(run_id))
            except _Exhausted as failed:
                raise StoreError(
                    f"run {run_id} ({experiment}): published to {self.url}, but its files "
                    f"could not be confirmed after the commit ({'; '.join(missing)}) nor its "
                    f"manifest withdrawn ({failed}): `cse store verify` checks it"
                ) from None
        return missing

    def missing_files(self, run_id: str, files: dict[str, dict[str, Any]]) -> list[str]:
        """The files of ``files`` (a manifest's) absent from the store's copy of the run or of
        another size: one look at each object, no download (``verify`` rehashes)."""

        def absent(rel: str) -> bool:
            remote = self._path(run_id, rel)
            with suppress(AttributeError):
                self.fs.invalidate_cache(remote)
            try:
                return self.fs.info(remote).get("size") != files[rel]["size"]
            except FileNotFoundError:
                return True

        try:
            return [rel for rel in files if self._attempts(rel, partial(absent, rel))]
        except _Exhausted as failed:
            raise StoreError(f"runs store {self.url}: cannot look at {run_id}/{failed}") from None

    def _withdraw(self, run_id: str) -> None:
        with suppress(FileNotFoundError):
            self.fs.rm(self._path(run_id, MANIFEST))

    def _confirmed(self, remote: str, digests: dict[str, Any]) -> bool:
        """Whether the stored object is the local file: its size, and its checksum (S3's ETag
        where it is the MD5 of the parts sent, else the object read back and rehashed)."""
        with suppress(AttributeError):
            self.fs.invalidate_cache(remote)
        try:
            info = self.fs.info(remote)
        except FileNotFoundError:
            return False
        if info.get("size") != digests["size"]:
            return False
        if str(info.get("ETag", "")).strip('"') == digests["etag"]:
            return True
        return self._stored_sha256(remote) == digests["sha256"]

    def _stored_sha256(self, remote: str) -> str:
        digest = hashlib.sha256()
        with self.fs.open(remote, "rb") as stored:
            while chunk := stored.read(CHUNK):
                digest.update(chunk)
        return digest.hexdigest()

    def _upload(self, run_id: str, rel: str, path: Path, digests: dict[str, Any]) -> None:
        remote = self._path(run_id, rel)
        if self._confirmed(remote, digests):  # stored by an interrupted publish: kept
            return
        self.fs.makedirs(self._path(run_id, *rel.split("/")[:-1]), exist_ok=True)
        options = {"chunksize": S3_PART_BYTES} if self.scheme in ("s3", "s3a") else {}
        self.fs.put_file(str(path), remote, **options)
        if not self._confirmed(remote, digests):
            raise _NotConfirmed("the stored object differs from the file sent")

    def _commit(self, run_id: str, manifest: dict[str, Any]) -> None:
        """Write the manifest atomically: a path or SSH store gets a temporary renamed into
        place; an object store one PUT (conditional, If-None-Match, on S3)."""
        data = json.dumps(manifest, indent=1).encode()
        path = self._path(run_id, MANIFEST)
        try:
            self._write_whole(path, data, create=True)
        except Exception:
            # a commit whose answer was lost, or an identical one by another publisher, stands
            with suppress(Exception):
                if (self._read_manifest_once(run_id) or {}).get("files") == manifest["files"]:
                    return
            raise
        if (self._read_manifest_once(run_id) or {}).get("files") != manifest["files"]:
            raise _NotConfirmed("the stored manifest differs from the one written")

    def _write_whole(self, path: str, data: bytes, create: bool = False) -> None:
        """Write ``path`` so that no reader sees it half-written: on an object store in one PUT
        (with ``create``, conditional on S3: If-None-Match); elsewhere under a temporary name,
        flushed on this machine, then renamed (over SSH, where SFTP's rename may refuse to
        replace a file, a file replaced, a lease, is written in place)."""
        if self.object_store or (not self.on_this_machine and self.fs.exists(path)):
            options = {"mode": "create"} if create and self.scheme in ("s3", "s3a") else {}
            self.fs.pipe_file(path, data, **options)
            return
        folder, _, name = path.rpartition("/")
        tmp = f"{folder}/.{name}.{HOST_TAG}-{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
        try:
            self.fs.pipe_file(tmp, data)
            if self.on_this_machine:
                sync_tree(Path(tmp))
            self.fs.mv(tmp, path)
        finally:
            with suppress(Exception):
                if self.fs.exists(tmp):
                    self.fs.rm(tmp)
        if self.on_this_machine:
            sync_folder(Path(folder))

    def _read_manifest_once(self, run_id: str) -> dict[str, Any] | None:
        with suppress(AttributeError):
            self.fs.invalidate_cache(self._path(run_id, MANIFEST))
        try:
            return json.loads(self.fs.cat_file(self._path(run_id, MANIFEST)))
        except FileNotFoundError:
            return None

    @property
    def on_this_machine(self) -> bool:
        """Whether the store is a path of this machine's filesystems (a local disk, an NFS
        mount), whose writes sit in the page cache until flushed; a remote store's server
        decides its own durability."""
        return "file" in tuple(self.fs.protocol)

    def verify(self, run_id: str) -> list[str]:
        """Problems of the store's copy of a run (rehashing every file); [] when intact."""
        manifest = self.manifest(run_id)
        if manifest is None:
            return [f"{run_id}: no manifest (an interrupted upload, never complete)"]
        problems = []
        for rel, meta in manifest["files"].items():
            try:
                digest = self._stored_sha256(self._path(run_id, rel))
            except FileNotFoundError:
                problems.append(f"{run_id}/{rel}: missing")
                continue
            if digest != meta["sha256"]:
                problems.append(f"{run_id}/{rel}: sha256 differs from the manifest")
        return problems

    def delete(self, run_id: str) -> str | None:
        """Delete a stored run, holding its lease; None when deleted, else why it was kept (its
        lease is held: a publish or a trainer of it is under way)."""
        try:
            with self.lease(run_id, "cse store gc", "deleted by `cse store gc`"):
                # the manifest first: a half-deleted run is incomplete, never damaged-and-complete
                self._withdraw(run_id)
                if self.fs.exists(self._path(run_id)):
                    self.fs.rm(self._path(run_id), recursive=True)
        except RunLocked:
            return "its lease is held (a publish or a trainer of it is under way)"
        return None

    # -- the store's clock -------------------------------------------------------------------

    def store_now(self) -> float | None:
        """The store's clock now: the modification time of a probe object written for it (None
        where the store reports no times)."""
        probe = self._path(f".clock.{HOST_TAG}-{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
        try:
            self.fs.makedirs(self.root, exist_ok=True)
            self.fs.pipe_file(probe, b"")
            return _mtime(self.fs.info(probe))
        except Exception:
            return None
        finally:
            with suppress(Exception):
                self.fs.rm(probe)

    def _age(self, path: str, now: float | None) -> float | None:
        """How long ago ``path`` was last written, by the store's clock."""
        if now is None:
            return None
        with suppress(AttributeError):
            self.fs.invalidate_cache(path)
        try:
            written = _mtime(self.fs.info(path))
        except FileNotFoundError:
            return None
        return None if written is None else max(0.0, now - written)

    # -- leases ------------------------------------------------------------------------------

    def _read_lease(self, run_id: str) -> dict[str, Any] | None:
        with suppress(AttributeError):
            self.fs.invalidate_cache(self._path(f"{run_id}.lease"))
        try:
            return json.loads(self.fs.cat_file(self._path(f"{run_id}.lease")))
        except (FileNotFoundError, ValueError):
            return None

    def _lease_left(self, run_id: str, held: dict[str, Any], now: float | None = None) -> float:
        """Seconds the lease ``held`` still lasts (<= 0: lapsed): by the store's clock (``now``,
        else read now) where it has one, else by the holder's expiry and this host's clock,
        with ``LEASE_SKEW_S``."""
        if _abandoned(held):
            return 0.0
        age = self._age(self._path(f"{run_id}.lease"), self.store_now() if now is None else now)
        if age is not None:
            return LEASE_S - age
        return float(held.get("expires", 0)) + LEASE_SKEW_S - self.clock()

    @contextmanager
    def lease(self, run_id: str, experiment: str, purpose: str = "trained") -> Iterator[None]:
        """Hold the run's lease in the store while the block runs (see the module docstring).
        ``purpose``: what its holder does with the run, as others' refusals say it ("is being
        trained", "published", "cleaned up by `cse store gc`")."""
        path = self._path(f"{run_id}.lease")
        held = self._read_lease(run_id)
        left = self._lease_left(run_id, held) if held else 0.0
        if held and left > 0:
            until = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.clock() + left))
            raise RunLocked(
                f"run {run_id} ({experiment}) is being {held.get('purpose', 'trained')} from "
                f"another workspace (host {held.get('host')}, pid {held.get('pid')}; its lease "
                f"in {self.url} lasts until {until} and is renewed every {LEASE_RENEW_S:.0f} s "
                "while held); this one stops. If that process was killed, its lease lapses "
                "then: rerun after it"
            )
        token = uuid.uuid4().hex
        lease = {"token": token, "host": socket.gethostname(), "machine": machine(),
                 "pid": os.getpid(), "experiment": experiment, "purpose": purpose}  # fmt: skip

        def write() -> None:
            # expires: informational, and the fallback of a store without modification times
            self._write_whole(
                path, json.dumps({**lease, "expires": self.clock() + LEASE_S}).encode()
            )

        self.fs.makedirs(self.root, exist_ok=True)
        write()
        time.sleep(LEASE_SETTLE_S)
        if (self._read_lease(run_id) or {}).get("token") != token:
            raise RunLocked(f"run {run_id} ({experiment}): another workspace took its lease")
        stop = threading.Event()

        def renew() -> None:
            while not stop.wait(LEASE_RENEW_S):
                try:
                    if (self._read_lease(run_id) or {}).get("token") != token:
                        return  # taken over (lapsed while unreachable): never written back
                    write()
                except Exception:  # a network fault: the next renewal tries again
                    continue

        renewer = threading.Thread(target=renew, daemon=True)
        renewer.start()
        self.leased.add(run_id)
        try:
            yield
        finally:
            self.leased.discard(run_id)
            stop.set()
            renewer.join()
            with suppress(Exception):  # unreachable: the lease lapses by itself
                if (self._read_lease(run_id) or {}).get("token") == token:
                    self.fs.rm(path)

    # -- leftovers ---------------------------------------------------------------------------

    def leftovers(self) -> list[Leftover]:
        """Leases, temporaries, uploads that never reached their manifest and (S3) multipart
        uploads never completed, each with its age by the store's clock, and whether a live
        lease covers it."""
        if not self.fs.exists(self.root):
            return []
        now = self.store_now()
        found: list[Leftover] = []
        held_runs: set[str] = set()
        folders = []
        for info in self.fs.ls(self.root, detail=True):
            path = info["name"].rstrip("/")
            name = path.rsplit("/", 1)[-1]
            if name.startswith(".clock."):
                continue  # another host's probe, written and removed in one go
            written = _mtime(info)
            age = None if now is None or written is None else max(0.0, now - written)
            if name.endswith(".lease"):
                run_id = name[: -len(".lease")]
                lease = self._read_lease(run_id) or {}
                live = self._lease_left(run_id, lease, now) > 0
                if live:
                    held_runs.add(run_id)
                what = f"lease of host {lease.get('host', '?')} ({lease.get('experiment', '?')})"
                found.append(Leftover(path, what, age, live))
            elif name.endswith(".tmp"):
                found.append(Leftover(path, "temporary", age))
            elif info.get("type") == "directory":
                folders.append((path, name))
        for path, run_id in folders:
            found += self._run_leftovers(path, run_id, now, run_id in held_runs)
        found += self._multipart_leftovers(now)
        return found

    def _newest(self, objects: dict[str, dict[str, Any]]) -> float | None:
        """The latest modification time of ``objects`` (fsspec ``find`` details), None where
        one has none."""
        times = [t for t in (_mtime(i) for i in objects.values()) if t is not None]
        return max(times) if times and len(times) == len(objects) else None

    def _run_leftovers(
        self, path: str, run_id: str, now: float | None, held: bool
    ) -> list[Leftover]:
        objects = self.fs.find(path, detail=True)
        newest = self._newest(objects)
        if MANIFEST not in {p.rsplit("/", 1)[-1] for p in objects} or not objects:
            age = None if now is None or newest is None else max(0.0, now - newest)
            what = f"files of run {run_id} without a manifest (an upload interrupted or under way)"
            return [Leftover(path, what, age, held, run_id=run_id)]
        return [
            Leftover(
                p,
                "temporary",
                None if now is None or _mtime(i) is None else max(0.0, now - _mtime(i)),
            )
            for p, i in objects.items()
            if p.rsplit("/", 1)[-1].endswith(".tmp")
        ]

    def _multipart_leftovers(self, now: float | None) -> list[Leftover]:
        if self.scheme not in ("s3", "s3a"):
            return []
        bucket, _, key = self.root.partition("/")
        try:
            listed = self.fs.call_s3(
                "list_multipart_uploads", Bucket=bucket, Prefix=f"{key}/" if key else ""
            )
        except Exception:
            return []
        return [
            Leftover(
                f"{bucket}/{upload['Key']}",
                "multipart upload never completed",
                None if now is None else max(0.0, now - upload["Initiated"].timestamp()),
                upload_id=upload["UploadId"],
            )
            for upload in listed.get("Uploads", [])
        ]

    def remove(self, leftover: Leftover, older_than: float) -> str | None:
        """Remove ``leftover`` (found by ``leftovers``, a while ago: `cse store gc` asks first)
        if it still is one, checked again just before: None when removed, else why it was
        kept. The files of an upload are removed holding the run's lease, and only while the
        run still has no manifest and nothing in them is newer than ``older_than``."""
        if leftover.upload_id:
            bucket, _, key = leftover.path.partition("/")
            self.fs.call_s3(
                "abort_multipart_upload", Bucket=bucket, Key=key, UploadId=leftover.upload_id
            )
            return None
        if leftover.run_id is not None:
            try:
                with self.lease(leftover.run_id, "cse store gc", "cleaned up by `cse store gc`"):
                    return self._remove_upload(leftover, older_than)
            except RunLocked:
                return "its lease is held (a publish or a trainer of the run is under way)"
        now = self.store_now()
        if leftover.path.endswith(".lease"):
            run_id = leftover.path.rsplit("/", 1)[-1][: -len(".lease")]
            lease = self._read_lease(run_id)
            if lease is not None and self._lease_left(run_id, lease, now) > 0:
                return "taken again meanwhile"
        else:
            age = self._age(leftover.path, now)
            if age is not None and age < older_than:
                return "written to meanwhile"
        with suppress(FileNotFoundError):
            self.fs.rm(leftover.path, recursive=True)
        return None

    def _remove_upload(self, leftover: Leftover, older_than: float) -> str | None:
        """The files of an upload without a manifest, removed (the caller holds the lease)."""
        assert leftover.run_id is not None
        if self._read_manifest_once(leftover.run_id) is not None:
            return "its manifest was committed meanwhile: a complete run"
        now = self.store_now()
        with suppress(AttributeError):
            self.fs.invalidate_cache(leftover.path)
        newest = self._newest(self.fs.find(leftover.path, detail=True))
        if now is not None and newest is not None and now - newest < older_than:
            return "written to meanwhile"
        with suppress(FileNotFoundError):
            self.fs.rm(leftover.path, recursive=True)
        return None


def _abandoned(lease: dict[str, Any]) -> bool:
    """A lease whose holder was a process of this machine that no longer exists (killed before
    it could give the lease back): taken over at once, as the local run lock's dead holder is."""
    return held_on_this_host(lease) and not process_exists(lease["pid"])


def store_url(configured: str | None) -> str | None:
    """The store's URL: $CSE_STORE_URL, else params' ``store.url`` (None: no shared store)."""
    return os.environ.get("CSE_STORE_URL") or configured or None
