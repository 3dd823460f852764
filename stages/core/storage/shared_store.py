"""A runs store shared by workspaces, machines and sites, addressed by a URL: a path (a local
folder or a shared filesystem), or an object store or remote host through fsspec, the library
DVC itself uses (``s3://``, ``gs://``, ``az://``, ``ssh://``, ... with the matching fsspec
package installed: s3fs, gcsfs, adlfs, sshfs).

Layout under the URL: ``<run_id>/<files>`` and ``<run_id>/manifest.json``, which lists every
file with its sha256 and size. Publishing uploads the files first and the manifest last, so a
run whose upload was interrupted has no manifest and is never seen as complete. Fetching checks
every file against the manifest before the run appears in the local runs folder (one rename).

One writer per run across workspaces: a lease object ``<run_id>.lease`` (holder, token, expiry),
renewed while training. Object stores have no portable atomic create, so a trainer writes its
lease, waits ``LEASE_SETTLE_S`` and reads it back: only the writer whose token survived trains.
A lease held by a dead process of this machine (``run_lock.machine``) is taken over at once; one
of another machine lapses ``LEASE_S`` after its last renewal.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from stages.core.errors import StageError
from stages.core.storage.atomic import rename_durably, sync_folder, sync_tree, temporary_beside
from stages.core.storage.hashing import CHUNK, sha256_of
from stages.core.storage.run_lock import RunLocked, held_on_this_host, machine, process_exists

MANIFEST = "manifest.json"
ORIGIN = "origin.json"  # local only: where the run came from (not part of the run's files)
LEASE_S = 600.0
LEASE_RENEW_S = 60.0
LEASE_SETTLE_S = 1.0


# The URL schemes of the stores the leases and uploads are meant for (fsspec's names; aliases
# included). Others fsspec may know (ftp://, http://) cannot hold a lease or are not stores.
STORE_SCHEMES = ("file", "s3", "gs", "gcs", "az", "abfs", "ssh", "sftp")


class StoreError(StageError):
    """The store cannot be read or holds a damaged run."""


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


class SharedStore:
    def __init__(self, url: str) -> None:
        import fsspec  # light, but only needed when a store is configured

        self.url = url.rstrip("/")
        problem = url_problem(self.url)
        if problem:
            raise StoreError(f"runs store {self.url}: {problem}")
        try:
            self.fs, root = fsspec.core.url_to_fs(self.url)
        except (ImportError, ValueError) as err:
            raise StoreError(f"runs store {self.url}: {err}") from None
        self.root = root.rstrip("/")

    def _path(self, *parts: str) -> str:
        return "/".join([self.root, *parts])

    def manifest(self, run_id: str) -> dict[str, Any] | None:
        """The run's manifest, or None when the store has no complete copy of it."""
        try:
            return json.loads(self.fs.cat_file(self._path(run_id, MANIFEST)))
        except FileNotFoundError:
            return None
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
            for rel, meta in manifest["files"].items():
                target = staging / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                self.fs.get_file(self._path(run_id, rel), str(target))
                actual = sha256_of(target)
                if actual != meta["sha256"]:
                    raise StoreError(
                        f"{self.url}/{run_id}/{rel}: sha256 {actual}, its manifest says "
                        f"{meta['sha256']}: the store's copy is damaged and was not used "
                        f"(`cse store verify` lists every damaged run)"
                    )
            write_origin(staging, {"origin": "fetched", "store": self.url,
                                   "published": manifest.get("published")})  # fmt: skip
            try:
                rename_durably(staging, dest)  # fails where dest is a folder holding files
            except OSError:
                if not all((dest / rel).is_file() for rel in manifest["files"]):
                    raise

    def publish(self, run_id: str, folder: Path, experiment: str) -> None:
        """Upload a complete local run: its files, then the manifest (the commit point)."""
        files = {}
        for rel in run_files(folder):
            path = folder / rel
            files[rel] = {"sha256": sha256_of(path), "size": path.stat().st_size}
            self.fs.makedirs(self._path(run_id, *rel.split("/")[:-1]), exist_ok=True)
            self.fs.put_file(str(path), self._path(run_id, rel))
        manifest = {"run_id": run_id, "experiment": experiment, "files": files,
                    "published": time.time(), "host": socket.gethostname()}  # fmt: skip
        if self.on_this_machine:  # the files on the disk before the commit point (a crash)
            sync_tree(Path(self._path(run_id)))
        self.fs.pipe_file(self._path(run_id, MANIFEST), json.dumps(manifest, indent=1).encode())
        if self.on_this_machine:
            sync_tree(Path(self._path(run_id, MANIFEST)))
            sync_folder(Path(self._path(run_id)))

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
            digest = hashlib.sha256()
            try:
                with self.fs.open(self._path(run_id, rel), "rb") as stored:
                    while chunk := stored.read(CHUNK):
                        digest.update(chunk)
            except FileNotFoundError:
                problems.append(f"{run_id}/{rel}: missing")
                continue
            if digest.hexdigest() != meta["sha256"]:
                problems.append(f"{run_id}/{rel}: sha256 differs from the manifest")
        return problems

    def delete(self, run_id: str) -> None:
        # the manifest first: a half-deleted run is then incomplete, never damaged-and-complete
        if self.fs.exists(self._path(run_id, MANIFEST)):
            self.fs.rm(self._path(run_id, MANIFEST))
        if self.fs.exists(self._path(run_id)):
            self.fs.rm(self._path(run_id), recursive=True)

    def _read_lease(self, run_id: str) -> dict[str, Any] | None:
        try:
            return json.loads(self.fs.cat_file(self._path(f"{run_id}.lease")))
        except (FileNotFoundError, ValueError):
            return None

    @contextmanager
    def lease(self, run_id: str, experiment: str) -> Iterator[None]:
        """Hold the run's lease in the store while the block runs (see the module docstring)."""
        path = self._path(f"{run_id}.lease")
        held = self._read_lease(run_id)
        if held and held.get("expires", 0) > time.time() and not _abandoned(held):
            until = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(held["expires"]))
            raise RunLocked(
                f"run {run_id} ({experiment}) is being trained from another workspace "
                f"(host {held.get('host')}, pid {held.get('pid')}; its lease in {self.url} "
                f"lasts until {until} and is renewed every {LEASE_RENEW_S:.0f} s while it "
                "trains); this one stops. If that trainer was killed, its lease lapses then: "
                "rerun after it"
            )
        token = uuid.uuid4().hex
        lease = {"token": token, "host": socket.gethostname(), "machine": machine(),
                 "pid": os.getpid(), "experiment": experiment,
                 "expires": time.time() + LEASE_S}  # fmt: skip
        self.fs.makedirs(self.root, exist_ok=True)
        self.fs.pipe_file(path, json.dumps(lease).encode())
        time.sleep(LEASE_SETTLE_S)
        if (self._read_lease(run_id) or {}).get("token") != token:
            raise RunLocked(f"run {run_id} ({experiment}): another workspace took its lease")
        stop = threading.Event()

        def renew() -> None:
            while not stop.wait(LEASE_RENEW_S):
                self.fs.pipe_file(
                    path, json.dumps({**lease, "expires": time.time() + LEASE_S}).encode()
                )

        renewer = threading.Thread(target=renew, daemon=True)
        renewer.start()
        try:
            yield
        finally:
            stop.set()
            renewer.join()
            if (self._read_lease(run_id) or {}).get("token") == token:
                self.fs.rm(path)


def _abandoned(lease: dict[str, Any]) -> bool:
    """A lease whose holder was a process of this machine that no longer exists (killed before
    it could give the lease back): taken over at once, as the local run lock's dead holder is."""
    return held_on_this_host(lease) and not process_exists(lease["pid"])


def store_url(configured: str | None) -> str | None:
    """The store's URL: $CSE_STORE_URL, else params' ``store.url`` (None: no shared store)."""
    return os.environ.get("CSE_STORE_URL") or configured or None
