"""The stage modules of the evaluations registered after SentEval and MTEB
(``stages.core.schema.evaluation_settings``), one module each."""
