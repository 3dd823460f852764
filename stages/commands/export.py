"""Export a trained run as a sentence-transformers / transformers model folder (and to the Hub).

    python -m stages.commands export EXPERIMENT DIR [--params FILE] [--checkpoint best|final]
        [--push-to-hub REPO [--private] [--dry-run]]

Copies the run's checkpoint (``runs/<run_id>/best`` by default) to DIR, adds the
sentence-transformers files if an older checkpoint lacks them, and rewrites its README.md model
card with the test scores the evaluation stages have written for this run
(experiments/<NAME>/senteval.json, mteb.json, when the run id they record is the run's). DIR
appears only once complete. ``--push-to-hub`` uploads DIR with huggingface_hub (``create_repo`` +
``upload_folder``; the endpoint is ``HF_ENDPOINT``, the token ``HF_TOKEN`` or the saved login,
never printed); ``--dry-run`` lists what would be uploaded and contacts nothing.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from stages.core.cli import parser
from stages.core.errors import StageError
from stages.core.identity.experiments import plan_experiments
from stages.core.schema.params import load_params
from stages.core.storage import layout
from stages.core.storage.atomic import atomic_path
from stages.modeling.checkpoint import read_encoder_info
from stages.modeling.model_card import render_model_card
from stages.modeling.st_format import ST_MODULES_FILE, write_sentence_transformers_files

MODEL_CARD = "README.md"


def _read_json(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def result_of_run(path: Path, run_id: str) -> dict[str, Any] | None:
    """The results JSON at ``path`` if it scored run ``run_id`` (the run id its encoder records),
    else None: the experiment's result of an earlier run (params changed since, the evaluation
    not rerun) says nothing about this one."""
    result = _read_json(path)
    if result is None:
        return None
    evaluated = result.get("encoder", {}).get("run_id")
    if evaluated != run_id:
        print(f"{path} scored run {evaluated}, not run {run_id}: left out of the card")
        return None
    return result


def export_checkpoint(
    checkpoint: Path, dest: Path, experiment_dir: Path, run_dir: Path, test_scores: bool = True
) -> list[str]:
    """Copy ``checkpoint`` to ``dest`` as a complete model folder; the files written, sorted.
    ``test_scores``: the evaluations' scores of this run go into the card (they are the best
    checkpoint's). The folder is written beside ``dest`` under a hidden temporary name and
    renamed into place once complete: an export cut short leaves no model-looking folder."""
    info = read_encoder_info(checkpoint)
    if info is None:
        raise StageError(f"{checkpoint} is not a trained checkpoint (no encoder.json)")
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise StageError(f"{dest} exists and is not empty; choose a new folder")
    run_id = run_dir.name
    with atomic_path(dest) as work:
        shutil.copytree(checkpoint, work)
        if not (work / ST_MODULES_FILE).is_file():
            write_sentence_transformers_files(work, info.eval_pooler)
        config = _read_json(work / "run.json") or {}
        metrics = _read_json(run_dir / "metrics.json") or {}
        evaluated = experiment_dir if test_scores else None
        card = render_model_card(
            config,
            metrics,
            senteval=result_of_run(evaluated / "senteval.json", run_id) if evaluated else None,
            mteb=result_of_run(evaluated / "mteb.json", run_id) if evaluated else None,
        )
        (work / MODEL_CARD).write_text(card, encoding="utf-8")
        files = sorted(str(p.relative_to(work)) for p in work.rglob("*") if p.is_file())
    return files


def push_to_hub(folder: Path, repo_id: str, *, private: bool, message: str) -> str:
    """Create ``repo_id`` (if needed) and upload ``folder``; the commit URL."""
    from huggingface_hub import HfApi, constants

    if constants.HF_HUB_OFFLINE:
        raise StageError("HF_HUB_OFFLINE is set: unset it to push (or use --dry-run)")
    api = HfApi()
    api.create_repo(repo_id, repo_type="model", private=private, exist_ok=True)
    commit = api.upload_folder(
        folder_path=str(folder), repo_id=repo_id, repo_type="model", commit_message=message
    )
    return str(commit)


def main(argv: Sequence[str] | None = None) -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("experiment", help="experiment name, e.g. simcse.bert-base.s42")
    p.add_argument("dir", help="destination folder (new or empty)")
    p.add_argument("--checkpoint", choices=("best", "final"), default="best")
    p.add_argument("--push-to-hub", metavar="REPO", help="upload to this Hub repo (owner/name)")
    p.add_argument("--private", action="store_true", help="create the Hub repo as private")
    p.add_argument("--dry-run", action="store_true", help="with --push-to-hub: only list")
    args = p.parse_args(argv)
    params = load_params(args.params)
    selected = plan_experiments(params).run(args.experiment)
    run_dir = layout.run_dir(selected.run_id)
    checkpoint = run_dir / args.checkpoint
    if not checkpoint.is_dir():
        raise StageError(f"{checkpoint} not found: train {args.experiment} first")
    dest = Path(args.dir)
    files = export_checkpoint(
        checkpoint,
        dest,
        layout.experiment_dir(args.experiment),
        run_dir,
        test_scores=args.checkpoint == "best",  # the evaluation stages score the best checkpoint
    )
    print(f"exported {args.experiment} ({args.checkpoint}) to {dest}: {len(files)} files")
    if not args.push_to_hub:
        return
    if args.dry_run:
        from huggingface_hub import constants

        print(f"dry run: would upload to {constants.ENDPOINT}/{args.push_to_hub}:")
        for name in files:
            print(f"  {name}")
        return
    url = push_to_hub(
        dest,
        args.push_to_hub,
        private=args.private,
        message=f"{args.experiment} ({args.checkpoint}, run {selected.run_id})",
    )
    print(f"pushed to {url}")
