"""Evaluation: what a validation pass or ``asyncrl eval`` measures, and how.

A pass decodes k responses to each prompt of every validation set (:mod:`.sets`), scores
them with the run's reward (:mod:`.passes`), and summarizes them per data source and
overall: mean@k, pass@j by the unbiased estimator (:mod:`.passk`), the best reward, the
response length (:mod:`.scores`).
"""
