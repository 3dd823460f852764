"""Stage ``download``: put a dataset of ``stages/core/schema/data_manifest.yaml`` in the data
folder.

    python -m stages.download {corpus,senteval,sts_raw} [--params params.yaml] [--dest data]

``corpus`` is the corpus named by params ``data.corpus``. With ``data.source: remote`` the files
come from their public URLs (streamed with a progress bar, retried with backoff, resumed from a
partial download with an HTTP Range request); with ``data.source: local`` they are copied from
``data.local_dir`` (``CSE_DATA_DIR`` wins), a folder with the data folder's layout. Either way every
file is checked against its sha256 in a temporary folder next to the output, and the output is
renamed into place only once all of them passed: nothing half-written or unverified ever sits at
the output path. An output already in place and intact is left as it is.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tarfile
import time
import zipfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import BinaryIO, Literal

import requests
import urllib3
from tqdm import tqdm

from stages.core.cli import parser, run
from stages.core.errors import StageError
from stages.core.schema.data_manifest import DataFile, Dataset, RemoteSource, load_manifest
from stages.core.schema.params import load_params
from stages.core.storage.atomic import atomic_path, write_json
from stages.core.storage.hashing import sha256_of

LOCK_FILE = "download-lock.json"  # in the data folder: sha256 of archives recorded at first use
CACHE_DIR = ".downloads"  # in the data folder: downloads in progress (*.part) and awaiting checks
RETRY_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
CHUNK = 1 << 20


@dataclass(frozen=True)
class HttpOptions:
    timeout: float = 60.0  # seconds to connect, and between two received chunks
    retries: int = 5  # further attempts after a failed one, each resuming where it stopped
    backoff: float = 2.0  # seconds before the first retry, doubled for each next one
    progress: bool = True


@dataclass(frozen=True)
class Report:
    output: Path
    action: Literal["up to date", "downloaded", "copied"]
    files: int  # files whose sha256 was checked
    notes: tuple[str, ...] = ()  # what the user must know: checksums recorded for the first time


def check_file(path: Path, entry: DataFile, origin: str) -> None:
    """Raise if ``path`` does not have ``entry``'s sha256; ``origin`` names it for the user."""
    actual = sha256_of(path)
    if actual != entry.sha256:
        raise StageError(
            f"checksum mismatch for {origin}: expected sha256 {entry.sha256}, got {actual}"
        )


def _is_intact(dataset: Dataset, dest: Path) -> bool:
    return all(
        (dest / f.path).is_file() and sha256_of(dest / f.path) == f.sha256 for f in dataset.files
    )


def _staged(dataset: Dataset, work: Path, entry: DataFile) -> Path:
    """Where ``entry`` goes inside ``work``, the temporary stand-in for the dataset's output."""
    if entry.path == dataset.output:
        return work
    target = work / PurePosixPath(entry.path).relative_to(dataset.output)
    target.parent.mkdir(parents=True, exist_ok=True)
    return target


def download_dataset(
    dataset: Dataset,
    dest: Path,
    *,
    source: Literal["remote", "local"],
    local_dir: Path | None = None,
    http: HttpOptions = HttpOptions(),
    session: requests.Session | None = None,
) -> Report:
    """Put ``dataset`` under ``dest`` from its public URLs or from ``local_dir``, all verified."""
    output = dest / dataset.output
    if _is_intact(dataset, dest):
        return Report(output, "up to date", len(dataset.files))
    if source == "local" and (local_dir is None or not local_dir.is_dir()):
        raise StageError(
            f"local data folder {local_dir} does not exist (set data.local_dir in params.yaml "
            "or the CSE_DATA_DIR environment variable)"
        )
    if source == "remote" and not dataset.remote:
        raise StageError(f"{dataset.output} has no public URL: {dataset.remote_unavailable}")
    notes: list[str] = []
    with atomic_path(output) as work:
        if dataset.output not in {f.path for f in dataset.files}:
            work.mkdir()
        if source == "local":
            _copy_local(dataset, local_dir, work)
        else:
            # a caller's session stays open for the caller
            with requests.Session() if session is None else nullcontext(session) as client:
                for remote in dataset.remote:
                    notes += _fetch_source(dataset, remote, dest, work, http, client)
    action = "copied" if source == "local" else "downloaded"
    return Report(output, action, len(dataset.files), tuple(notes))


def _copy_local(dataset: Dataset, local_dir: Path, work: Path) -> None:
    for entry in dataset.files:
        origin = local_dir / entry.path
        if not origin.is_file():
            raise StageError(
                f"{origin} is missing (expected sha256 {entry.sha256}); the local data folder "
                "must have the layout of the data folder (see docs/download.md)"
            )
        target = _staged(dataset, work, entry)
        shutil.copyfile(origin, target)
        check_file(target, entry, str(origin))


def _fetch_source(
    dataset: Dataset,
    remote: RemoteSource,
    dest: Path,
    work: Path,
    http: HttpOptions,
    session: requests.Session,
) -> list[str]:
    """Download one source into the cache, verify it and put its files into ``work``."""
    cache = dest / CACHE_DIR
    cache.mkdir(parents=True, exist_ok=True)
    url_id = hashlib.sha256(remote.url.encode()).hexdigest()[:10]
    download = cache / f"{url_id}-{PurePosixPath(remote.url).name}"
    fetch(remote.url, download, http, session)
    try:
        files = dataset.files_from(remote)
        lock_path = dest / LOCK_FILE
        if remote.archive is None:
            expected, known_from = files[0].sha256, "the manifest"
        elif remote.sha256 is not None:
            expected, known_from = remote.sha256, "the manifest"
        else:
            expected = _read_lock(lock_path).get(remote.url, {}).get("sha256")
            known_from = f"recorded in {lock_path}"
        actual = sha256_of(download)
        if expected is not None and actual != expected:
            raise StageError(
                f"checksum mismatch for {remote.url}: expected sha256 {expected} ({known_from}), "
                f"got {actual}; the download was removed and nothing was put in place"
            )
        if remote.archive is None:
            os.replace(download, _staged(dataset, work, files[0]))
            return []
        _extract(remote, download, files, dataset, work)
        if expected is not None:
            return []
        _record_lock(lock_path, remote.url, actual, download.stat().st_size)
        return [
            f"{remote.url} has no published sha256: its {len(files)} files passed their own "
            f"checks, and its sha256 {actual} is now recorded in {lock_path}"
        ]
    finally:
        download.unlink(missing_ok=True)  # a bad download is never reused; a good one is used up


def fetch(url: str, target: Path, http: HttpOptions, session: requests.Session) -> None:
    """Download ``url`` to ``target`` through ``target.part``, resuming and retrying.

    A partial download survives failures and is continued by the next attempt or the next run.
    """
    part = target.with_name(target.name + ".part")
    delay = http.backoff
    attempts = http.retries + 1
    problem = ""
    for attempt in range(attempts):
        try:
            if _transfer(url, part, http, session):
                os.replace(part, target)
                return
            problem = "the transfer ended before the announced size"
        except (requests.RequestException, urllib3.exceptions.HTTPError) as err:
            # no connection, timeout, a stream broken mid-transfer, a 5xx answer
            problem = f"{type(err).__name__}: {err}"
        if attempt + 1 < attempts:
            time.sleep(delay)
            delay *= 2
    kept = f"; the partial download {part} is kept and resumed next time" if part.exists() else ""
    raise StageError(f"could not download {url} in {attempts} attempts ({problem}){kept}")


class _RetryableStatus(requests.RequestException):
    pass


def _transfer(url: str, part: Path, http: HttpOptions, session: requests.Session) -> bool:
    """One attempt; True when ``part`` holds the whole resource."""
    have = part.stat().st_size if part.exists() else 0
    headers = {"Accept-Encoding": "identity"}  # byte ranges must refer to the stored bytes
    if have:
        headers["Range"] = f"bytes={have}-"
    with session.get(url, headers=headers, stream=True, timeout=http.timeout) as response:
        status = response.status_code
        if status == 416:  # the partial file is no prefix of the resource (it changed): start over
            part.unlink(missing_ok=True)
            raise _RetryableStatus(f"HTTP 416 for a resumed download of {url}")
        if status in RETRY_STATUSES:
            raise _RetryableStatus(f"HTTP {status} {response.reason}")
        if status >= 400:
            raise StageError(f"could not download {url}: HTTP {status} {response.reason}")
        if status == 206 and not response.headers.get("Content-Range", "").startswith(
            f"bytes {have}-"
        ):
            part.unlink(missing_ok=True)
            raise _RetryableStatus(f"HTTP 206 for {url} with an unexpected Content-Range")
        if status != 206:
            have = 0  # the server sent the whole resource instead of the rest: start over
        total = _total_size(response, have)
        with (
            part.open("ab" if have else "wb") as fh,
            tqdm(
                total=total,
                initial=have,
                unit="B",
                unit_scale=True,
                unit_divisor=1024,
                desc=PurePosixPath(url).name,
                disable=not http.progress,
                file=sys.stderr,
            ) as bar,
        ):
            # Raw reads hand over every byte received before a broken connection, so the next
            # attempt resumes exactly there (iter_content drops a partly filled chunk).
            for chunk in response.raw.stream(CHUNK, decode_content=False):
                fh.write(chunk)
                bar.update(len(chunk))
    return total is None or part.stat().st_size == total


def _total_size(response: requests.Response, have: int) -> int | None:
    content_range = response.headers.get("Content-Range", "")
    if response.status_code == 206 and "/" in content_range:
        size = content_range.rsplit("/", 1)[1]
        return int(size) if size.isdigit() else None
    length = response.headers.get("Content-Length")
    return have + int(length) if length and length.isdigit() else None


def _extract(
    remote: RemoteSource,
    archive: Path,
    files: Sequence[DataFile],
    dataset: Dataset,
    work: Path,
) -> None:
    """Copy ``files`` out of ``archive`` into ``work``, each checked against its sha256.

    Where the folder matching ``remote.root`` sits inside the archive (``./``, ``downstream/``,
    ``test-gold/``...) is found from the first file; every other file must sit in the same folder.
    Only the listed members are read, so no archive path can write outside ``work``.
    """
    with _members(archive, remote.archive, remote.url) as members:
        relative = [str(PurePosixPath(f.path).relative_to(remote.root)) for f in files]
        prefix = _member_prefix(members, relative[0], remote.url)
        for entry, rel in zip(files, relative, strict=True):
            member = prefix + rel
            if member not in members:
                raise StageError(f"{remote.url} has no member {member} (for {entry.path})")
            target = _staged(dataset, work, entry)
            with members[member]() as src, target.open("wb") as dst:
                shutil.copyfileobj(src, dst, CHUNK)
            check_file(target, entry, f"{entry.path} (member {member} of {remote.url})")


@contextmanager
def _members(
    archive: Path, kind: Literal["tar", "zip"] | None, url: str
) -> Iterator[dict[str, Callable[[], BinaryIO]]]:
    """The regular files of ``archive`` by normalised name, each with a function opening it."""
    try:
        if kind == "zip":
            with zipfile.ZipFile(archive) as zf:
                yield {
                    _normalised(info.filename): (lambda info=info: zf.open(info))
                    for info in zf.infolist()
                    if not info.is_dir()
                }
        else:
            with tarfile.open(archive, "r:*") as tf:
                yield {
                    _normalised(m.name): (lambda m=m: tf.extractfile(m))
                    for m in tf.getmembers()
                    if m.isfile()
                }
    except (tarfile.TarError, zipfile.BadZipFile, EOFError) as err:
        raise StageError(
            f"{url} is not a readable {kind} archive ({err}); the download was removed"
        ) from None


def _normalised(name: str) -> str:
    return str(PurePosixPath(name.removeprefix("./")))


def _member_prefix(members: dict[str, object], relative: str, url: str) -> str:
    prefixes = sorted(
        (name.removesuffix(relative) for name in members if _ends_with_path(name, relative)),
        key=len,
    )
    if not prefixes:
        raise StageError(f"{url} has no member {relative} (in any folder)")
    return prefixes[0]


def _ends_with_path(name: str, relative: str) -> bool:
    return name == relative or name.endswith("/" + relative)


def _read_lock(path: Path) -> dict[str, dict[str, object]]:
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise StageError(f"{path} is not valid JSON ({err}); fix or delete it") from None


def _record_lock(path: Path, url: str, sha256: str, size: int) -> None:
    # Re-read just before writing, so that downloads running side by side keep each other's entries.
    lock = _read_lock(path)
    lock[url] = {"sha256": sha256, "size": size}
    write_json(path, lock)


def main(argv: Sequence[str] | None = None) -> None:
    p = parser("Fetch or copy a dataset into the data folder, verifying every sha256.")
    p.add_argument(
        "dataset",
        choices=["corpus", "senteval", "sts_raw"],
        help="corpus: the training corpus named by data.corpus",
    )
    p.add_argument("--dest", default="data", help="data folder (default: data)")
    args = p.parse_args(argv)
    data = load_params(args.params).data
    name = data.corpus if args.dataset == "corpus" else args.dataset
    local_dir = data.resolved_local_dir()
    report = download_dataset(
        load_manifest().datasets[name], Path(args.dest), source=data.source, local_dir=local_dir
    )
    for note in report.notes:
        print(f"note: {note}", file=sys.stderr)
    origin = {"copied": f" from {local_dir}", "downloaded": " from its public URLs"}
    print(
        f"{name}: {report.action}{origin.get(report.action, '')}, "
        f"{report.files} files verified (sha256) -> {report.output}"
    )


if __name__ == "__main__":
    run(main)
