"""The manifest: its schema refuses inconsistent entries, and the shipped one is complete."""

from __future__ import annotations

import re

import pytest
from pydantic import ValidationError

from stages.core.schema.data_manifest import Dataset, load_manifest
from stages.core.schema.params import DataParams

SHA = "0" * 64


def entry(**changes: object) -> dict[str, object]:
    base: dict[str, object] = {
        "description": "d",
        "output": "sts_raw",
        "files": [
            {"path": "sts_raw/A/x.txt", "sha256": SHA},
            {"path": "sts_raw/B/y.txt", "sha256": SHA},
        ],
        "remote": [
            {"url": "https://example.org/a.zip", "archive": "zip", "root": "sts_raw/A"},
            {"url": "https://example.org/b.zip", "archive": "zip", "root": "sts_raw/B"},
        ],
    }
    return base | changes


def test_a_consistent_entry_is_accepted():
    dataset = Dataset.model_validate(entry())
    assert [f.path for f in dataset.files_from(dataset.remote[1])] == ["sts_raw/B/y.txt"]


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"output": "senteval"}, "is not under output senteval"),
        ({"remote": []}, "either remote sources or remote_unavailable"),
        ({"remote_unavailable": "why"}, "either remote sources or remote_unavailable"),
        (
            {
                "remote": [
                    {"url": "https://example.org/a.zip", "archive": "zip", "root": "sts_raw/A"}
                ]
            },
            "sts_raw/B/y.txt is provided by 0 sources",
        ),
        (
            {"remote": [{"url": "https://example.org/x.txt", "root": "sts_raw/x.txt"}]},
            "root sts_raw/x.txt is no file",
        ),
        ({"files": [{"path": "sts_raw/../x", "sha256": SHA}]}, "normalised relative path"),
        ({"files": [{"path": "sts_raw/A/x.txt", "sha256": "abc"}]}, "should match pattern"),
    ],
)
def test_inconsistent_entries_are_refused(changes, message):
    with pytest.raises(ValidationError, match=re.escape(message)):
        Dataset.model_validate(entry(**changes))


def test_plain_file_checksum_belongs_to_the_file_entry():
    changes = {
        "output": "corpus/c.txt",
        "files": [{"path": "corpus/c.txt", "sha256": SHA}],
        "remote": [{"url": "https://example.org/c.txt", "root": "corpus/c.txt", "sha256": SHA}],
    }
    with pytest.raises(ValidationError, match="takes its sha256 from its entry under files"):
        Dataset.model_validate(entry(**changes))


def test_shipped_manifest_covers_every_corpus_and_the_shared_data(shared_data):
    manifest = load_manifest()
    corpora = DataParams.model_fields["corpus"].annotation.__args__
    assert set(corpora) | {"senteval", "sts_raw"} == set(manifest.datasets)
    listed = {f.path: f.sha256 for d in manifest.datasets.values() for f in d.files}
    table = dict(
        re.findall(
            r"^\| (\S+) \|[^`\n]*`([0-9a-f]{64})`", (shared_data / "MANIFEST.md").read_text(), re.M
        )
    )
    assert len(table) == 140
    assert {p: s for p, s in listed.items() if p in table} == table
    assert set(listed) - set(table) == {"corpus/wiki1m.txt"}


def test_unknown_checksums_are_explicit_and_only_on_archives():
    for dataset in load_manifest().datasets.values():
        for remote in dataset.remote:
            assert remote.archive is not None or remote.sha256 is None
    senteval = load_manifest().datasets["senteval"].remote[0]
    assert senteval.sha256 is None and senteval.url.endswith("/senteval.tar")
