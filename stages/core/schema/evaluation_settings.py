"""The evaluation registry: every evaluation an experiment gets, registered once.

An evaluation is one module of ``stages/evaluations/`` that scores an experiment's encoder (a
trained run's best checkpoint or a baseline) and writes ``experiments/<NAME>/<evaluation>.json``;
the evaluate stage runs it (``python -m stages.evaluate <evaluation> --experiment NAME``). Its entry
in ``EVALUATIONS`` is all the pipeline knows of it: the job graph gives each experiment one job per
enabled evaluation (DVC stages and the one generic Snakemake rule follow), its id covers its run,
its settings, its data and the import closure of its module
(``stages.core.identity.experiments.evaluation_id``), and the report prints the tables it
declares. Its settings are the params section ``evaluations.<name>``.

The task lists live here and nowhere else in the core (SentEval's STS and transfer tasks; MTEB's
named sets in ``stages.core.schema.mteb_task_sets``). Like ``objective_settings``, this module is
the schema only: the stage modules are named, not imported, so the core stays torch-free.

Adding an evaluation (docs/extending.md, "Add an evaluation"): a settings class and one entry in
``EVALUATIONS`` here, its stage module in ``stages/evaluations/``, one test file.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StringConstraints,
    create_model,
    field_validator,
)

from stages.core.schema.bounds import Integer
from stages.core.schema.data_manifest import is_under, load_manifest
from stages.core.schema.id_markers import InId
from stages.core.schema.mteb_task_sets import (
    SIMACE56,
    STS7,
    TASK_SETS,
    task_names,
    unknown_task_names,
)
from stages.core.storage import layout
from stages.core.storage.hashing import folder_digest, sha256_of

SENTEVAL_STS_TASKS = (
    "STS12", "STS13", "STS14", "STS15", "STS16", "STSBenchmark", "SICKRelatedness",
)  # fmt: skip
SENTEVAL_TRANSFER_TASKS = ("MR", "CR", "SUBJ", "MPQA", "SST2", "TREC", "MRPC")
SENTEVAL_TASKS = SENTEVAL_STS_TASKS + SENTEVAL_TRANSFER_TASKS
SentEvalTask = Literal[SENTEVAL_TASKS]  # type: ignore[valid-type]
# STS-B development set: checkpoint selection in training (its best Spearman is in train.json),
# alignment and uniformity in the SentEval results.
STSB_DEV_TASK = "STSBenchmark_dev"
MtebLocalSource = Literal["senteval", "sts_raw"]
SentEvalEncoding = Literal["distinct", "senteval_batches"]
# A count: an integer of at least 1, never a boolean (YAML's `true` would pass as 1).
PositiveInt = Annotated[Integer, Field(gt=0)]
TaskName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", max_length=64)]


class EvaluationSettings(BaseModel):
    """Base class of every evaluation's params section: whether it runs and what data it reads."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    # The manifest datasets it reads (verified at use, so their checksums name them).
    datasets: ClassVar[tuple[str, ...]] = ()

    def is_enabled(self) -> bool:
        return True

    def reads(self) -> tuple[Path, ...]:
        """The data its job depends on (DVC deps, Snakemake inputs)."""
        return tuple(layout.DATA / name for name in self.datasets)

    def encoded_sentences(self) -> int | None:
        """How many sentences it encodes, for time estimates (None: unknown, an allowance)."""
        return None

    def task_names(self) -> tuple[str, ...]:
        """The tasks it scores, by the names its results use."""
        return ()

    def data_identity(self) -> dict[str, str | None]:
        """Its data by content (part of its id): what it reads in the workspace's data/ by the
        manifest's sha256 (checked against the files at every use), a folder of the user's
        elsewhere (not the manifest's, so never checked) by its files' own hashes."""
        manifest = load_manifest()
        data = layout.DATA.resolve()
        identity: dict[str, str | None] = {}
        for path in self.reads():
            try:
                inside = path.resolve().relative_to(data).as_posix()
            except ValueError:
                identity[str(path)] = folder_digest(path) if path.is_dir() else None
                continue
            identity |= {
                f.path: f.sha256
                for dataset in manifest.datasets.values()
                for f in dataset.files
                if is_under(f.path, inside) or is_under(inside, f.path)
            }
        return identity


class SentEvalParams(EvaluationSettings):
    datasets: ClassVar[tuple[str, ...]] = ("senteval",)

    data_dir: str = Field("data/senteval", description="SentEval layout root (has downstream/)")
    tasks: Annotated[tuple[SentEvalTask, ...], Field(min_length=1)] = SENTEVAL_TASKS
    mode: Literal["fasttest", "test"] = Field(
        "test", description="SimCSE's classifier settings: fasttest (k=5) or test (k=10)"
    )
    batch_size: PositiveInt = 128
    seed: Annotated[Integer, Field(ge=0, lt=2**32)] = 1111
    # Added after evaluations were stored: distinct is what they computed (id_markers.InId).
    encoding: Annotated[SentEvalEncoding, InId(absent="distinct")] = Field(
        "distinct",
        description="distinct: each distinct sentence encoded once, in batches of equal token "
        "length (fast); senteval_batches: SentEval's own batches (each task's samples in its "
        "length-sorted order, batch_size sentences per padded forward, every occurrence "
        "encoded), for SentEval's numbers to the last bit on near-ties",
    )

    def reads(self) -> tuple[Path, ...]:
        return (Path(self.data_dir),)

    def task_names(self) -> tuple[str, ...]:
        return self.tasks


class MtebParams(EvaluationSettings):
    # read: STS-B (and STS12-16 with local_source sts_raw) from sts_raw, STS12-16 and SICK-R
    # from senteval; both name the evaluation's data whatever it reads
    datasets: ClassVar[tuple[str, ...]] = ("senteval", "sts_raw")

    enabled: StrictBool = True
    tasks: str | tuple[str, ...] = Field(
        "sts",
        description="a named set (sts: STS12-16, STSBenchmark, SICK-R; simace56: the SimACE "
        "paper's 56 English datasets, = MTEB(eng, v1)) or a list of mteb task names",
    )
    local_data: StrictBool = Field(
        True,
        description="feed the tasks that have a local copy (STS12-16, STSBenchmark, SICK-R) "
        "from local files instead of the Hugging Face hub",
    )
    local_source: MtebLocalSource = Field(
        "senteval",
        description="senteval: STS12-16 and SICK-R from senteval_dir (STS12-16 = MTEB's text), "
        "STSBenchmark from sts_raw_dir; sts_raw: STS12-16 and STSBenchmark from the original "
        "SemEval files in sts_raw_dir (untokenised text; no SICK-R)",
    )
    sts_raw_dir: str = Field("data/sts_raw", description="raw SemEval STS12-16 + stsbenchmark/")
    senteval_dir: str = Field("data/senteval", description="SentEval layout root (downstream/)")
    cache_dir: str = Field(
        "cache/mteb", description="mteb's result cache (results/<model>/<revision>/<task>.json)"
    )
    normalize: StrictBool = Field(
        False,
        description="L2-normalise embeddings; cosine scores are unchanged, classification and "
        "clustering are not",
    )
    batch_size: PositiveInt = 128

    @field_validator("tasks")
    @classmethod
    def _known_tasks(cls, tasks: str | tuple[str, ...]) -> str | tuple[str, ...]:
        if isinstance(tasks, str):
            if tasks not in TASK_SETS:
                raise ValueError(
                    f"unknown task set '{tasks}'; named sets: {', '.join(TASK_SETS)} "
                    f"(a single task is a list: [{tasks}])"
                )
            return tasks
        if not tasks:
            raise ValueError("empty task list")
        unknown = unknown_task_names(tasks)
        if unknown:
            raise ValueError(f"not in mteb's task registry: {', '.join(unknown)}")
        return tasks

    def is_enabled(self) -> bool:
        return self.enabled

    def task_names(self) -> tuple[str, ...]:
        return task_names(self.tasks)

    def reads(self) -> tuple[Path, ...]:
        if not self.local_data:
            return ()
        if self.local_source == "senteval":
            return Path(self.sts_raw_dir), Path(self.senteval_dir)
        return (Path(self.sts_raw_dir),)


class StsTsvParams(EvaluationSettings):
    """Your own STS-style data: TSV files with a header row ``sentence1 sentence2 score``, scored
    as SentEval scores STS (cosine, Pearson and Spearman x100)."""

    files: dict[TaskName, str] = Field(
        {},
        description="task name -> TSV file (columns sentence1, sentence2, score); "
        "none: the evaluation does not run",
    )
    batch_size: PositiveInt = 128

    @field_validator("files")
    @classmethod
    def _own_task_names(cls, files: dict[str, str]) -> dict[str, str]:
        taken = sorted(set(files) & {*SENTEVAL_TASKS, *TASK_SETS["simace56"], STSB_DEV_TASK})
        if taken:
            raise ValueError(f"{', '.join(taken)}: already the name of a SentEval or MTEB task")
        return files

    def is_enabled(self) -> bool:
        return bool(self.files)

    def task_names(self) -> tuple[str, ...]:
        return tuple(self.files)

    def reads(self) -> tuple[Path, ...]:
        return tuple(Path(path) for path in self.files.values())

    def encoded_sentences(self) -> int | None:
        files = [Path(path) for path in self.files.values()]
        if not all(file.is_file() for file in files):
            return None
        # two sentences per line, the header line aside
        return sum(2 * (len(file.read_bytes().splitlines()) - 1) for file in files)

    def data_identity(self) -> dict[str, str | None]:
        return {path: sha256_of(Path(path)) if Path(path).is_file() else None
                for path in self.files.values()}  # fmt: skip


@dataclass(frozen=True)
class Table:
    """A report table: mean ± std over seeds of ``metric``, one column per task, then the
    average column; no tasks: every task the evaluation reports."""

    title: str
    metric: str
    tasks: tuple[str, ...] = ()
    average: str | None = None

    @property
    def columns(self) -> tuple[str, ...]:
        return (*self.tasks, *([self.average] if self.average else []))


@dataclass(frozen=True)
class Evaluation:
    """One registered evaluation (its name is its key in ``EVALUATIONS``)."""

    settings: type[EvaluationSettings]
    # Its module in stages/evaluations/ (a ``main(argv)``, run by ``python -m stages.evaluate
    # <name> ...``); the import closure of the two is the evaluation's code
    # (stages.core.identity.code).
    module: str
    summary: str
    tables: tuple[Table, ...] = ()
    # Whether a method's runs may override the section (`methods.<m>.evaluations.<name>`).
    method_overrides: bool = False
    # Whether its result JSON is a DVC metric (`dvc metrics show`; small, not cached by DVC).
    dvc_metrics: bool = False

    @property
    def code_modules(self) -> tuple[str, ...]:
        return ("stages.evaluate", self.module)

    @staticmethod
    def section(name: str) -> str:
        """Its params.yaml key."""
        return f"evaluations.{name}"


EVALUATIONS: dict[str, Evaluation] = {
    "senteval": Evaluation(
        SentEvalParams,
        "stages.evaluations.senteval",
        "SentEval's STS (cosine Spearman x100) and transfer tasks (logistic regression accuracy)",
        tables=(
            Table("STS (Spearman x100)", "spearman", SENTEVAL_STS_TASKS, "STS_avg"),
            Table("Transfer (accuracy %)", "accuracy", SENTEVAL_TRANSFER_TASKS, "TR_avg"),
        ),
        dvc_metrics=True,
    ),
    "mteb": Evaluation(
        MtebParams,
        "stages.evaluations.mteb",
        "MTEB with the official mteb package: a named task set or a list of mteb task names",
        tables=(
            Table(
                "MTEB (main score x100)",
                "mteb_main_score",
                (*STS7, *(f"MTEB_{category}" for category in SIMACE56)),
                "MTEB_avg",
            ),
        ),
        method_overrides=True,
    ),
    "sts_tsv": Evaluation(
        StsTsvParams,
        "stages.evaluations.sts_tsv",
        "your own STS-style TSV files, scored as SentEval's STS (the worked example of "
        "docs/extending.md)",
        tables=(Table("Own STS data (Spearman x100)", "spearman"),),
        dvc_metrics=True,
    ),
}
# Sections that moved under `evaluations:` (params.py names the new place of an old key).
FORMERLY_TOP_LEVEL = ("senteval", "mteb")

# params.yaml's `evaluations:` section: the settings of every registered evaluation, by its name.
EvaluationSections = create_model(  # type: ignore[call-overload]
    "EvaluationSections",
    __base__=EvaluationSettings,
    **{
        name: (evaluation.settings, evaluation.settings())
        for name, evaluation in EVALUATIONS.items()
    },
)


def output_file(evaluation: str, experiment: str) -> Path:
    """experiments/<experiment>/<evaluation>.json: what the orchestrators track."""
    return layout.experiment_dir(experiment) / f"{evaluation}.json"


DOCS_BEGIN = "<!-- evaluations: generated from stages/core/schema/evaluation_settings.py -->\n"
DOCS_END = "<!-- end of evaluations -->\n"


def evaluations_markdown() -> str:
    """The registry as the Markdown table README.md shows."""
    lines = [
        "| evaluation | module | params | report tables (columns) |",
        "|---|---|---|---|",
    ]
    for name, evaluation in EVALUATIONS.items():
        tables = "; ".join(
            f"{t.title}: {', '.join(t.columns) or 'one per task it reports'}"
            for t in evaluation.tables
        )
        lines.append(
            f"| `{name}`: {evaluation.summary} | `{evaluation.module}` "
            f"| `{evaluation.section(name)}` | {tables} |"
        )
    return "\n".join(lines) + "\n"


def with_evaluations_table(text: str) -> str:
    """``text`` (README.md) with the table between its markers generated from the registry (``python
    -m stages.commands.pipeline docs``; tests/test_evaluations.py checks it is current)."""
    head, begin, rest = text.partition(DOCS_BEGIN)
    _, end, tail = rest.partition(DOCS_END)
    if not begin or not end:
        raise ValueError(f"no {DOCS_BEGIN.strip()} ... {DOCS_END.strip()} block")
    return head + DOCS_BEGIN + evaluations_markdown() + DOCS_END + tail
