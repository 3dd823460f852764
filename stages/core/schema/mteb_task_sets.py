"""Named MTEB task sets and the resolution of a params.yaml ``mteb.tasks`` entry to task objects.

``simace56`` is the 56-dataset English MTEB set of the SimACE paper (§4.5, App. G; transcribed in
shared/papers/spec-simace-cooldown.md). The paper lists only 10 clustering datasets although its
Table 12 counts 11; the eleventh, ArxivClusteringP2P, is the one missing from the list, and with it
the set is exactly mteb's ``MTEB(eng, v1)`` benchmark (checked by the tests). Its tasks are taken
from that benchmark, so they carry its English-only filters (AmazonCounterfactual ``en``, STS17
``en-en``, STS22 ``en``, the English subsets of MassiveIntent/Scenario, MTOP and AmazonReviews;
the test split everywhere except MSMARCO's dev), as on the MTEB leaderboard. No name changed
between MTEB 1.x (the paper's) and mteb 2.x: every name below is in mteb's registry.

``sts`` is the STS column of the papers' STS tables in MTEB form: STS12-16, STSBenchmark, SICK-R.

Importing this module does not import mteb (params.yaml validation stays fast); checking an
explicit task list against mteb's registry does, and building task objects
(``stages.mteb_protocol.tasks``) does.
"""

from __future__ import annotations

from collections.abc import Sequence

# category (mteb's task type) -> datasets, in the paper's order
SIMACE56: dict[str, tuple[str, ...]] = {
    "Classification": (
        "AmazonCounterfactualClassification",
        "AmazonPolarityClassification",
        "AmazonReviewsClassification",
        "Banking77Classification",
        "EmotionClassification",
        "ImdbClassification",
        "MassiveIntentClassification",
        "MassiveScenarioClassification",
        "MTOPDomainClassification",
        "MTOPIntentClassification",
        "ToxicConversationsClassification",
        "TweetSentimentExtractionClassification",
    ),
    "Clustering": (
        "ArxivClusteringP2P",  # not in the paper's list; see the module docstring
        "ArxivClusteringS2S",
        "BiorxivClusteringP2P",
        "BiorxivClusteringS2S",
        "MedrxivClusteringP2P",
        "MedrxivClusteringS2S",
        "RedditClustering",
        "RedditClusteringP2P",
        "StackExchangeClustering",
        "StackExchangeClusteringP2P",
        "TwentyNewsgroupsClustering",
    ),
    "PairClassification": ("SprintDuplicateQuestions", "TwitterSemEval2015", "TwitterURLCorpus"),
    "Reranking": (
        "AskUbuntuDupQuestions",
        "MindSmallReranking",
        "SciDocsRR",
        "StackOverflowDupQuestions",
    ),
    # "15 retrieval datasets from Thakur et al. (2021)" (BEIR), not named by the paper
    "Retrieval": (
        "ArguAna",
        "ClimateFEVER",
        "CQADupstackRetrieval",
        "DBPedia",
        "FEVER",
        "FiQA2018",
        "HotpotQA",
        "MSMARCO",
        "NFCorpus",
        "NQ",
        "QuoraRetrieval",
        "SCIDOCS",
        "SciFact",
        "Touche2020",
        "TRECCOVID",
    ),
    # "8 from STS benchmark, STS22 and BIOSSES"
    "STS": (
        "BIOSSES",
        "SICK-R",
        "STS12",
        "STS13",
        "STS14",
        "STS15",
        "STS16",
        "STS17",
        "STS22",
        "STSBenchmark",
    ),
    "Summarization": ("SummEval",),
}
SIMACE56_BENCHMARK = "MTEB(eng, v1)"
# The tasks whose splits or subsets that benchmark narrows (to the test split and the English
# subsets); mteb's registry gives every other task of the set exactly as the benchmark does
# (checked by the tests). Only these need the benchmark, whose registry takes about a second to
# build once transformers has loaded torch's compiler.
BENCHMARK_NARROWED = frozenset({
    "AmazonCounterfactualClassification", "AmazonReviewsClassification",
    "MassiveIntentClassification", "MassiveScenarioClassification", "MTOPDomainClassification",
    "MTOPIntentClassification", "STS17", "STS22",
})  # fmt: skip
STS7 = ("STS12", "STS13", "STS14", "STS15", "STS16", "STSBenchmark", "SICK-R")

TASK_SETS: dict[str, tuple[str, ...]] = {
    "sts": STS7,
    "simace56": tuple(name for names in SIMACE56.values() for name in names),
}


def task_names(spec: str | Sequence[str]) -> tuple[str, ...]:
    """The task names of a named set, or the given list itself (duplicates dropped)."""
    if isinstance(spec, str):
        if spec not in TASK_SETS:
            raise ValueError(f"unknown MTEB task set '{spec}'; named sets: {', '.join(TASK_SETS)}")
        return TASK_SETS[spec]
    return tuple(dict.fromkeys(spec))


def unknown_task_names(names: Sequence[str]) -> list[str]:
    """Names that are not in mteb's task registry. Names of the named sets are known without
    asking mteb; any other name is looked up offline in mteb's registry (importing mteb)."""
    known = {name for names in TASK_SETS.values() for name in names}
    others = [name for name in names if name not in known]
    if not others:
        return []
    import mteb

    unknown = []
    for name in others:
        try:
            mteb.get_task(name)
        except KeyError:
            unknown.append(name)
    return unknown
