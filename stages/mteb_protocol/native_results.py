"""An evaluation's results in mteb's own layout, beside the experiment's results JSON.

mteb's result cache (params ``mteb.cache_dir``) is shared by every encoder and may be cleared;
this writes a self-contained copy with mteb's own ``ResultCache.save_to_cache``:
``<dest>/results/<model name>/<revision>/<task>.json`` plus ``model_meta.json``, the layout of
mteb's results repository. ``mteb.ResultCache(<dest>).load_results()`` reads it back, so a run
can be compared with published models using mteb's tooling (e.g. merged with
``ResultCache().load_results(models=[...])`` of the public results).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # mteb takes seconds to import; native_results_dir is needed without it
    from mteb.models import ModelMeta

NATIVE_DIR = "mteb_results"


def native_results_dir(results_json: str | Path) -> Path:
    """Where the mteb-layout copy of the results in ``results_json`` goes: a sibling folder."""
    return Path(results_json).parent / NATIVE_DIR


def write_native_results(
    cache_dir: str | Path, meta: ModelMeta, tasks: Sequence[str], dest: str | Path
) -> Path:
    """Copy ``tasks``' results of ``meta`` from mteb's cache to ``dest``; the revision folder."""
    from mteb.cache import ResultCache

    source, target = ResultCache(Path(cache_dir)), ResultCache(Path(dest))
    for task in tasks:
        result = source.load_task_result(task, meta, raise_if_not_found=True)
        target.save_to_cache(result, meta)
    return target.get_task_result_path(tasks[0], meta).parent if tasks else target.cache_path
