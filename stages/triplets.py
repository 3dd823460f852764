"""Stage: ArcCSE's masked triplets (s, s', s'') of the training corpus, as one Parquet file.

    python -m stages.triplets --corpus PATH --backbone KEY --output PATH [--params params.yaml]

writes the triplets at ``--output`` (columns and dtypes: ``TRIPLETS_SCHEMA``; the procedure:
``stages.masked_triplets.masking``) and their counts as JSON next to it (``stats_path``). The
trainer reads the file with ``read_triplets``, which checks the contract. The triplets' id
(``stages.core.identity.experiments.triplets_id``) covers everything that determines their bytes,
the masking code included. The stage computes it from the params and the corpus it read, records
it in the file and its stats, and refuses an ``--output`` named by another id; a params file
edited while it runs stops it before it writes (``input_guard``)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import polars as pl

from stages.core.cli import parser, run
from stages.core.errors import StageError
from stages.core.identity.experiments import corpus_identity, triplets_id
from stages.core.schema.data_check import verify_workspace_data
from stages.core.schema.params import Params, TripletsParams, load_params
from stages.core.storage import layout
from stages.core.storage.atomic import write_json
from stages.core.storage.input_guard import watch
from stages.masked_triplets.file_format import named_id, write_triplets
from stages.masked_triplets.masking import (
    MaskingTokenizer,
    TripletCounts,
    TripletsError,
    generate_triplets,
    split_lines,
)
from stages.modeling.backbone import ModelLoadError, load_tokenizer

# The file layout's version, recorded in the stats (the procedure is covered by the code identity).
FORMAT_VERSION = 1


def tokenizer_fingerprint(tokenizer: MaskingTokenizer) -> str:
    """sha256 of everything about the tokenizer that the triplets depend on."""
    state = {
        "backend": json.loads(tokenizer.backend.to_str()),
        "mask_token": tokenizer.mask_token,
        "mask_token_id": tokenizer.mask_token_id,
        "max_tokens": tokenizer.max_tokens,
    }
    canonical = json.dumps(state, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def stats_path(output: str | Path) -> Path:
    """Where the counts of the triplet file ``output`` go: ``<stem>.stats.json`` beside it."""
    output = Path(output)
    return output.with_name(f"{output.stem}.stats.json")


def read_corpus(path: str | Path) -> tuple[list[str], str]:
    """The corpus lines (``split_lines``) and the sha256 of the file's bytes."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise StageError(f"corpus {path}: no such file") from None
    except OSError as err:
        raise StageError(f"corpus {path}: cannot read: {err.strerror}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        before = data[: err.start]
        line = before.count(b"\n") + before.count(b"\r") - before.count(b"\r\n") + 1
        raise StageError(
            f"corpus {path}, line {line}: not UTF-8 ({err.reason} at byte {err.start})"
        ) from None
    return split_lines(text), hashlib.sha256(data).hexdigest()


def read_id(
    params: Params, backbone: str, method: str | None, corpus: Path, corpus_sha256: str
) -> tuple[str | None, str]:
    """The triplets id of what the stage read (``triplets_id``), or None and why no id
    describes it: the id is a method's, and covers params' ``data.corpus`` (by its manifest
    sha256 where the data manifest has one, else by name), so it describes a run of the stage
    given ``--method`` and that corpus."""
    if method is None:
        return None, "without --method the stage computes no triplets id"
    known = corpus_identity(params)["sha256"]
    if known:
        other = corpus_sha256 != known
    else:
        other = corpus.resolve() != layout.corpus_file(params.data.corpus).resolve()
    if other:
        return None, f"--corpus {corpus} is not data.corpus {params.data.corpus} that ids cover"
    return triplets_id(params, backbone, method), ""


def triplet_stats(
    triplets: pl.DataFrame,
    counts: TripletCounts,
    params: TripletsParams,
    *,
    triplets_id: str | None,
    corpus_sha256: str,
    backbone: dict[str, Any],
    tokenizer: MaskingTokenizer,
) -> dict[str, Any]:
    """The stats JSON: counts (every line is a triplet or skipped for one reason), provenance
    and the realised span lengths. Deterministic: no paths, times or versions."""
    summary = triplets.select(
        units_mean=pl.col("n_units").mean(),
        units_min=pl.col("n_units").min(),
        units_max=pl.col("n_units").max(),
        short_fraction=((pl.col("short_end") - pl.col("short_start")) / pl.col("n_units")).mean(),
        long_fraction=((pl.col("long_end") - pl.col("long_start")) / pl.col("n_units")).mean(),
    ).row(0, named=True)

    def rounded(value: float | None) -> float | None:
        return None if value is None else round(value, 6)

    return {
        "format_version": FORMAT_VERSION,
        "triplets_id": triplets_id,
        "corpus_sha256": corpus_sha256,
        "backbone": backbone,
        "tokenizer": {
            "fingerprint": tokenizer_fingerprint(tokenizer),
            "mask_token": tokenizer.mask_token,
            "max_tokens": tokenizer.max_tokens,
        },
        "params": params.model_dump(mode="json"),
        "lines": counts.lines,
        "triplets": counts.triplets,
        "skipped": counts.skipped,
        "units_per_sentence": {
            "mean": rounded(summary["units_mean"]),
            "min": summary["units_min"],
            "max": summary["units_max"],
        },
        "masked_fraction_mean": {
            "short": rounded(summary["short_fraction"]),
            "long": rounded(summary["long_fraction"]),
        },
    }


def main(argv: Sequence[str] | None = None) -> None:
    p = parser("Generate ArcCSE's masked triplets (s, s', s'') of a corpus as Parquet.")
    p.add_argument("--corpus", required=True, help="training corpus, one sentence per line")
    p.add_argument("--backbone", required=True, help="key in params.yaml's backbones")
    p.add_argument("--method", help="a method whose triplets overrides apply (default: none)")
    p.add_argument("--output", required=True, help="the Parquet file to write")
    args = p.parse_args(argv)

    inputs = watch(Path(args.params))
    params = load_params(args.params)
    if args.backbone not in params.backbones:
        defined = ", ".join(sorted(params.backbones))
        raise StageError(f"--backbone {args.backbone!r}: not in {args.params}; defined: {defined}")
    backbone = params.backbones[args.backbone]
    if args.method is not None and args.method not in params.methods:
        raise StageError(f"--method {args.method!r}: not in {args.params}")
    settings = params.triplets_for(args.method) if args.method else params.triplets
    verify_workspace_data(Path(args.corpus), params_file=args.params)
    lines, corpus_sha256 = read_corpus(args.corpus)
    inputs.add(Path(args.corpus), corpus_sha256)
    tid, why_none = read_id(params, args.backbone, args.method, Path(args.corpus), corpus_sha256)
    named = named_id(args.output)
    if named is not None and named != tid:
        raise StageError(
            f"--output {args.output} is named triplets id {named}, but what this stage read "
            f"({args.params}, --corpus {args.corpus}) is triplets id "
            + (tid if tid else f"none ({why_none})")
            + ": it writes no triplets under another id's name (were the params edited after "
            "the job was planned?)"
        )
    try:
        loaded = load_tokenizer(backbone, args.backbone)
    except ModelLoadError as err:  # names the backbone's key and model
        raise StageError(str(err)) from None
    try:
        tokenizer = MaskingTokenizer.from_pretrained(loaded)
        triplets, counts = generate_triplets(lines, tokenizer, settings)
    except TripletsError as err:
        raise StageError(f"backbone {args.backbone!r} ({backbone.model}): {err}") from None

    stats = triplet_stats(
        triplets,
        counts,
        settings,
        triplets_id=tid,
        corpus_sha256=corpus_sha256,
        backbone={"key": args.backbone, "model": backbone.model, "revision": backbone.revision},
        tokenizer=tokenizer,
    )
    with inputs.guarding():
        write_triplets(triplets, args.output, tid)
        write_json(stats_path(args.output), stats)
    skipped = ", ".join(f"{reason} {n:,}" for reason, n in counts.skipped.items())
    print(f"triplets: {counts.triplets:,} of {counts.lines:,} lines ({skipped}) -> {args.output}")


if __name__ == "__main__":
    run(main)
