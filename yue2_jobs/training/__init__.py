"""Training YuE2 and the data it learns from.

    train.py     the three-stage recipe (`yue2 train`, `make checkpoints`)
    losses.py    the stage losses; batches.py  encoding, collation and the stage mixes
    data.py      the shipped corpora (`make data`), built by sources.py from pinned packages
    evaluate.py  ROUGE of a checkpoint on a held-out split (`yue2 eval`)
"""
