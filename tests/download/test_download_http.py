"""The remote path for real: downloads from a local HTTP server, with broken transfers,
server errors, corrupt files and archives."""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
import zipfile
from pathlib import Path

import pytest

from stages.core.errors import StageError
from stages.core.schema.data_manifest import Dataset, load_manifest
from stages.download import CACHE_DIR, LOCK_FILE, HttpOptions, download_dataset

FAST = HttpOptions(timeout=5, retries=3, backoff=0.01, progress=False)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def corpus_text(lines: int = 3000) -> bytes:
    return "".join(f"Sentence number {i} of a small corpus.\n" for i in range(lines)).encode()


def corpus_dataset(url: str, body: bytes) -> Dataset:
    return Dataset.model_validate(
        {
            "description": "test corpus",
            "output": "corpus/tiny.txt",
            "files": [{"path": "corpus/tiny.txt", "sha256": sha(body)}],
            "remote": [{"url": url, "root": "corpus/tiny.txt"}],
        }
    )


def leftovers(dest: Path) -> list[str]:
    """Anything a failed or finished download left besides outputs and the lock file."""
    found = [p for p in dest.rglob("*") if p.is_file() and p.name != LOCK_FILE]
    found += [p for p in dest.rglob("*.tmp")]
    return sorted(str(p.relative_to(dest)) for p in found)


def test_plain_file_downloads_with_a_progress_bar(http_server, tmp_path, capsys):
    body = corpus_text()
    http_server.files["/wiki.txt"] = body
    dataset = corpus_dataset(http_server.url("/wiki.txt"), body)
    report = download_dataset(
        dataset, tmp_path, source="remote", http=HttpOptions(backoff=0.01, progress=True)
    )
    assert report.action == "downloaded" and report.files == 1 and report.notes == ()
    assert (tmp_path / "corpus/tiny.txt").read_bytes() == body
    assert leftovers(tmp_path) == ["corpus/tiny.txt"]
    progress = capsys.readouterr().err
    assert "wiki.txt" in progress and "100%" in progress

    again = download_dataset(dataset, tmp_path, source="remote", http=FAST)
    assert again.action == "up to date"
    assert len(http_server.seen) == 1


def test_corrupt_download_names_the_file_and_checksums_and_leaves_nothing(http_server, tmp_path):
    body = corpus_text()
    corrupt = body.replace(b"number 7 ", b"number 8 ")
    http_server.files["/wiki.txt"] = corrupt
    url = http_server.url("/wiki.txt")
    with pytest.raises(StageError) as err:
        download_dataset(corpus_dataset(url, body), tmp_path, source="remote", http=FAST)
    message = str(err.value)
    assert url in message and sha(body) in message and sha(corrupt) in message
    assert leftovers(tmp_path) == []
    assert not (tmp_path / "corpus/tiny.txt").exists()


def test_interrupted_transfer_is_resumed_with_a_range_request(http_server, tmp_path):
    body = corpus_text()
    http_server.files["/wiki.txt"] = body
    http_server.cut_after["/wiki.txt"] = 20_000
    dataset = corpus_dataset(http_server.url("/wiki.txt"), body)
    download_dataset(dataset, tmp_path, source="remote", http=FAST)
    assert http_server.ranges("/wiki.txt") == [None, "bytes=20000-"]
    assert (tmp_path / "corpus/tiny.txt").read_bytes() == body
    assert leftovers(tmp_path) == ["corpus/tiny.txt"]


def test_partial_download_is_kept_and_resumed_by_the_next_run(http_server, tmp_path):
    body = corpus_text()
    http_server.files["/wiki.txt"] = body
    http_server.cut_after["/wiki.txt"] = 12_345
    dataset = corpus_dataset(http_server.url("/wiki.txt"), body)
    once = HttpOptions(timeout=5, retries=0, progress=False)
    with pytest.raises(StageError, match=r"partial download .* is kept and resumed"):
        download_dataset(dataset, tmp_path, source="remote", http=once)
    (part,) = (tmp_path / CACHE_DIR).glob("*.part")
    assert part.stat().st_size == 12_345
    assert not (tmp_path / "corpus/tiny.txt").exists()

    download_dataset(dataset, tmp_path, source="remote", http=once)
    assert http_server.ranges("/wiki.txt") == [None, "bytes=12345-"]
    assert (tmp_path / "corpus/tiny.txt").read_bytes() == body
    assert leftovers(tmp_path) == ["corpus/tiny.txt"]


def test_server_ignoring_the_range_restarts_from_zero(http_server, tmp_path):
    body = corpus_text()
    http_server.files["/wiki.txt"] = body
    http_server.cut_after["/wiki.txt"] = 5_000
    http_server.ignore_range.add("/wiki.txt")
    download_dataset(
        corpus_dataset(http_server.url("/wiki.txt"), body), tmp_path, source="remote", http=FAST
    )
    assert http_server.ranges("/wiki.txt") == [None, "bytes=5000-"]
    assert (tmp_path / "corpus/tiny.txt").read_bytes() == body


def test_partial_download_of_a_since_shortened_file_starts_over(http_server, tmp_path):
    http_server.files["/wiki.txt"] = corpus_text()
    http_server.cut_after["/wiki.txt"] = 12_345
    url = http_server.url("/wiki.txt")
    once = HttpOptions(timeout=5, retries=0, progress=False)
    with pytest.raises(StageError):
        download_dataset(corpus_dataset(url, corpus_text()), tmp_path, source="remote", http=once)

    shorter = corpus_text(100)  # the server now has a file shorter than what we hold
    http_server.files["/wiki.txt"] = shorter
    download_dataset(corpus_dataset(url, shorter), tmp_path, source="remote", http=FAST)
    assert http_server.ranges("/wiki.txt") == [None, "bytes=12345-", None]
    assert (tmp_path / "corpus/tiny.txt").read_bytes() == shorter


def test_server_errors_are_retried(http_server, tmp_path):
    body = corpus_text(10)
    http_server.files["/wiki.txt"] = body
    http_server.fail_with["/wiki.txt"] = [503, 502]
    download_dataset(
        corpus_dataset(http_server.url("/wiki.txt"), body), tmp_path, source="remote", http=FAST
    )
    assert len(http_server.seen) == 3
    assert (tmp_path / "corpus/tiny.txt").read_bytes() == body


def test_persistent_server_errors_give_up_with_the_url(http_server, tmp_path):
    http_server.fail_with["/wiki.txt"] = [503] * 10
    url = http_server.url("/wiki.txt")
    with pytest.raises(StageError, match=r"could not download .*wiki\.txt in 4 attempts.*503"):
        download_dataset(corpus_dataset(url, b"x"), tmp_path, source="remote", http=FAST)
    assert len(http_server.seen) == 4
    assert leftovers(tmp_path) == []


def test_missing_url_is_a_clear_error_without_retries(http_server, tmp_path):
    url = http_server.url("/nowhere.txt")
    with pytest.raises(StageError, match=r"could not download http://\S+/nowhere\.txt: HTTP 404"):
        download_dataset(corpus_dataset(url, b"x"), tmp_path, source="remote", http=FAST)
    assert len(http_server.seen) == 1
    assert leftovers(tmp_path) == []


def test_dataset_without_public_url_says_so(tmp_path):
    dataset = Dataset.model_validate(
        {
            "description": "sample",
            "output": "corpus/sample.txt",
            "files": [{"path": "corpus/sample.txt", "sha256": sha(b"x")}],
            "remote_unavailable": "assembled by hand; use data.source: local",
        }
    )
    with pytest.raises(StageError, match="has no public URL: assembled by hand"):
        download_dataset(dataset, tmp_path, source="remote", http=FAST)


# --- archives -------------------------------------------------------------------------------

MEMBERS = {
    "STS/STS12-en-test/STS.input.MSRpar.txt": b"a b\tc d\n" * 50,
    "STS/STS12-en-test/STS.gs.MSRpar.txt": b"4.2\n" * 50,
    "TREC/train_5500.label": b"DESC:manner How did serfdom develop ?\n" * 30,
}
EXTRA = {"SNLI/s1.train": b"not listed in the manifest\n"}


def make_archive(kind: str, members: dict[str, bytes], prefix: str) -> bytes:
    buffer = io.BytesIO()
    if kind == "zip":
        with zipfile.ZipFile(buffer, "w") as zf:
            for name, data in members.items():
                zf.writestr(prefix + name, data)
    else:
        with tarfile.open(fileobj=buffer, mode="w:gz" if kind == "tar.gz" else "w") as tf:
            for name, data in members.items():
                info = tarfile.TarInfo(prefix + name)
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def archive_dataset(url: str, kind: str, archive_sha256: str | None = None) -> Dataset:
    return Dataset.model_validate(
        {
            "description": "test SentEval data",
            "output": "senteval",
            "files": [
                {"path": f"senteval/downstream/{name}", "sha256": sha(data)}
                for name, data in MEMBERS.items()
            ],
            "remote": [
                {
                    "url": url,
                    "archive": "zip" if kind == "zip" else "tar",
                    "sha256": archive_sha256,
                    "root": "senteval/downstream",
                }
            ],
        }
    )


@pytest.mark.parametrize(
    ("kind", "prefix"), [("tar", ""), ("tar", "./"), ("tar.gz", "downstream/"), ("zip", "gold/")]
)
def test_archive_members_are_extracted_verified_and_the_archive_locked(
    http_server, tmp_path, kind, prefix
):
    archive = make_archive(kind, MEMBERS | EXTRA, prefix)
    http_server.files["/senteval.tar"] = archive
    url = http_server.url("/senteval.tar")
    report = download_dataset(archive_dataset(url, kind), tmp_path, source="remote", http=FAST)

    assert report.files == len(MEMBERS)
    for name, data in MEMBERS.items():
        assert (tmp_path / "senteval/downstream" / name).read_bytes() == data
    assert not (tmp_path / "senteval/downstream/SNLI").exists()
    assert leftovers(tmp_path) == sorted(f"senteval/downstream/{n}" for n in MEMBERS)
    lock = json.loads((tmp_path / LOCK_FILE).read_text())
    assert lock == {url: {"sha256": sha(archive), "size": len(archive)}}
    (note,) = report.notes
    assert "no published sha256" in note and sha(archive) in note


def test_locked_archive_checksum_is_enforced_later(http_server, tmp_path):
    http_server.files["/senteval.tar"] = make_archive("tar", MEMBERS, "")
    url = http_server.url("/senteval.tar")
    download_dataset(archive_dataset(url, "tar"), tmp_path, source="remote", http=FAST)
    locked = json.loads((tmp_path / LOCK_FILE).read_text())[url]["sha256"]

    # The same members repacked with an extra file: each member would pass, the archive must not.
    http_server.files["/senteval.tar"] = make_archive("tar", MEMBERS | EXTRA, "")
    os.remove(tmp_path / "senteval/downstream/TREC/train_5500.label")
    with pytest.raises(StageError) as err:
        download_dataset(archive_dataset(url, "tar"), tmp_path, source="remote", http=FAST)
    assert locked in str(err.value) and LOCK_FILE in str(err.value)
    # the damaged output stays as it was; nothing new was put in place
    assert not (tmp_path / "senteval/downstream/TREC/train_5500.label").exists()
    assert (tmp_path / "senteval/downstream/STS/STS12-en-test/STS.gs.MSRpar.txt").exists()


def test_archive_with_a_known_checksum_is_checked_first(http_server, tmp_path):
    archive = make_archive("tar", MEMBERS, "")
    http_server.files["/senteval.tar"] = archive + b"\0" * 512
    url = http_server.url("/senteval.tar")
    with pytest.raises(StageError, match=f"expected sha256 {sha(archive)}"):
        download_dataset(archive_dataset(url, "tar", sha(archive)), tmp_path, source="remote")
    assert leftovers(tmp_path) == []


def test_corrupt_archive_member_names_the_file_and_leaves_nothing(http_server, tmp_path):
    bad = dict(MEMBERS)
    bad["TREC/train_5500.label"] = MEMBERS["TREC/train_5500.label"].replace(b"?", b"!")
    http_server.files["/senteval.tar"] = make_archive("tar", bad, "")
    with pytest.raises(StageError) as err:
        download_dataset(
            archive_dataset(http_server.url("/senteval.tar"), "tar"),
            tmp_path,
            source="remote",
            http=FAST,
        )
    message = str(err.value)
    assert "senteval/downstream/TREC/train_5500.label" in message
    assert sha(MEMBERS["TREC/train_5500.label"]) in message
    assert leftovers(tmp_path) == []
    assert not (tmp_path / "senteval").exists() and not (tmp_path / LOCK_FILE).exists()


def test_archive_missing_a_member_names_it(http_server, tmp_path):
    partial = {k: v for k, v in MEMBERS.items() if not k.startswith("TREC")}
    http_server.files["/senteval.tar"] = make_archive("tar", partial, "downstream/")
    with pytest.raises(StageError, match=r"has no member downstream/TREC/train_5500\.label"):
        download_dataset(
            archive_dataset(http_server.url("/senteval.tar"), "tar"),
            tmp_path,
            source="remote",
            http=FAST,
        )
    assert leftovers(tmp_path) == []


def test_a_file_that_is_no_archive_is_a_clear_error(http_server, tmp_path):
    http_server.files["/senteval.tar"] = b"<html>Temporarily unavailable</html>"
    with pytest.raises(StageError, match="is not a readable tar archive"):
        download_dataset(
            archive_dataset(http_server.url("/senteval.tar"), "tar"),
            tmp_path,
            source="remote",
            http=FAST,
        )
    assert leftovers(tmp_path) == []


# --- the shipped manifest entries, served over HTTP ------------------------------------------


def served(dataset: Dataset, http_server, archives: dict[str, bytes]) -> Dataset:
    """``dataset`` with each remote URL pointing at the test server, which serves ``archives``."""
    remotes = []
    for remote in dataset.remote:
        path = "/" + remote.url.rsplit("/", 1)[1]
        http_server.files[path] = archives[remote.root]
        remotes.append(remote.model_copy(update={"url": http_server.url(path)}))
    return dataset.model_copy(update={"remote": tuple(remotes)})


def test_senteval_entry_unpacks_a_simcse_style_tar(shared_data, http_server, tmp_path):
    # SimCSE's download_dataset.sh runs `tar xvf senteval.tar` inside downstream/.
    dataset = load_manifest().datasets["senteval"]
    members = {
        f.path.removeprefix("senteval/downstream/"): (shared_data / f.path).read_bytes()
        for f in dataset.files
    }
    archive = make_archive("tar", members | EXTRA, "")
    report = download_dataset(
        served(dataset, http_server, {"senteval/downstream": archive}),
        tmp_path,
        source="remote",
        http=FAST,
    )
    assert report.files == 78
    assert leftovers(tmp_path) == sorted(f.path for f in dataset.files)


def test_sts_raw_entry_unpacks_the_semeval_archives(shared_data, http_server, tmp_path):
    # The STS wiki archives hold one folder each (test-gold/, sts-en-test-gs-2014/, ...).
    dataset = load_manifest().datasets["sts_raw"]
    archives = {}
    for remote in dataset.remote:
        files = dataset.files_from(remote)
        members = {
            f.path.removeprefix(remote.root + "/"): (shared_data / f.path).read_bytes()
            for f in files
        }
        kind = "zip" if remote.archive == "zip" else "tar.gz"
        archives[remote.root] = make_archive(kind, members, "some-folder/")
    report = download_dataset(
        served(dataset, http_server, archives), tmp_path, source="remote", http=FAST
    )
    assert report.files == 60 and len(report.notes) == 6
    assert leftovers(tmp_path) == sorted(f.path for f in dataset.files)
    assert len(json.loads((tmp_path / LOCK_FILE).read_text())) == 6
