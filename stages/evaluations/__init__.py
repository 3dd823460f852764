"""The stage modules of the evaluations registered after SentEval and MTEB
(``stages.core.evaluations``), one module each."""
