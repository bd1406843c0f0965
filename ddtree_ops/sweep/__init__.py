"""`sweep`: redeploy the tree service with each budget/topk, measure it against the baseline, recommend one.

plan (validate the lists, pure) → run (drain, health-gated deploy, warm, measure with compare's
machinery, restore) → report (sweep.json / sweep.md / sweep.png, the recommendation); state keeps
what finished in the output folder so an interrupted sweep can be resumed.
"""
